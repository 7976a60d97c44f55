-- One currency per account, and the amount and balance limits in the schema (docs/bad-input.md
-- "payments-api amounts"). An account's balance is the sum of its payments' amounts, which means
-- something only in one currency: the account takes the currency of its first payment, and a
-- payment in another currency is refused (422) with nothing written.
ALTER TABLE payments_api_accounts ADD COLUMN currency TEXT;

-- An account made before this migration takes the currency of its first payment.
UPDATE payments_api_accounts AS account
   SET currency = (SELECT payment.currency
                     FROM payments_api_payments AS payment
                    WHERE payment.account_id = account.account_id
                    ORDER BY payment.created_at, payment.payment_id
                    LIMIT 1);
-- An account is written only with its payment, so every account has one; this is a guard.
UPDATE payments_api_accounts SET currency = 'XXX' WHERE currency IS NULL;

ALTER TABLE payments_api_accounts
    ALTER COLUMN currency SET NOT NULL,
    ADD CONSTRAINT payments_api_accounts_currency_iso CHECK (currency ~ '^[A-Z]{3}$'),
    -- The service refuses a payment that would pass i64::MAX (BIGINT's top) before it gets here;
    -- a negative balance cannot come from positive amounts.
    ADD CONSTRAINT payments_api_accounts_balance_positive CHECK (balance >= 0) NOT VALID;

-- payment_request::MAX_AMOUNT. NOT VALID: a payment recorded before the limit stays as it was;
-- every new row is checked.
ALTER TABLE payments_api_payments
    ADD CONSTRAINT payments_api_payments_amount_range
        CHECK (amount BETWEEN 1 AND 1000000000000) NOT VALID;
