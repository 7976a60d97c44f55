// Card authorisations as a WebAssembly transform for eos-processor, in AssemblyScript: the same
// logic as examples/wasm/go/main.go, answering the same bytes for the same input
// (docs/TRANSFORMS.md "WebAssembly transforms"; the wasm-transform crate's tests compare them).
//
// Per card and UTC day it keeps what was spent in each currency, in minor units. An
// authorisation that would take the day's spend in its currency above the daily limit is
// refused (over_daily_limit); every other one is approved to the default output, and one of at
// least the flag threshold goes to the "flagged" output as well.
//
// The input is read and the result written with ./eos.ts, the helper beside it, which writes
// strings as the Go module's helper (examples/wasm/go/eos) does.

import * as eos from "./eos";

// The same defaults as the Go module, in minor units.
const DAILY_LIMIT: i64 = 100000;
const FLAG_AT: i64 = 50000;
const I64_MAX: i64 = 9223372036854775807;
// The output large authorisations also go to (--output flagged=TOPIC).
const FLAGGED_OUTPUT = "flagged";
const HEX = "0123456789abcdef";

export function eos_interface_version(): i32 {
  eos.outputVersion();
  return 0;
}

// Where the authorisations keep their id, card and time, the outputs written to and the
// members read: the processor needs no --event-id, --entity or --occurred-at, refuses to start
// without --output flagged=TOPIC, and hands apply only the amount and the currency of each
// authorisation's value (the rest reaches the outputs through eos.Output's with).
export function eos_contract(): i32 {
  const contract = new eos.Contract();
  contract.eventId = "/auth_id";
  contract.entity = "/card";
  contract.occurredAt = "/at";
  contract.outputs = [eos.DEFAULT_OUTPUT, FLAGGED_OUTPUT];
  contract.reads = ["amount", "currency"];
  eos.outputContract(contract);
  return 0;
}

// Go's strconv.Quote for the printable text an amount is.
function goQuote(text: string): string {
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c == 0x22) out += '\\"';
    else if (c == 0x5c) out += "\\\\";
    else if (c == 0x0a) out += "\\n";
    else if (c == 0x09) out += "\\t";
    else if (c == 0x0d) out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += "\\x" + HEX.charAt(c >> 4) + HEX.charAt(c & 15);
    else out += String.fromCharCode(c);
  }
  return out + '"';
}

// ---- the logic ------------------------------------------------------------------------------

function isDigits(part: string): bool {
  if (part.length == 0) return false;
  for (let i = 0; i < part.length; i++) {
    const c = part.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
  }
  return true;
}

// "12.50" → 1250; -1 when it is not digits with up to two decimal places or passes an i64.
function minorUnits(text: string): i64 {
  const point = text.indexOf(".");
  const units = point < 0 ? text : text.substring(0, point);
  const cents = point < 0 ? "" : text.substring(point + 1);
  if (!isDigits(units) || (point >= 0 && (!isDigits(cents) || cents.length > 2))) return -1;
  let whole: i64 = 0;
  for (let i = 0; i < units.length; i++) {
    const digit = i64(units.charCodeAt(i) - 0x30);
    if (whole > (I64_MAX - digit) / 10) return -1;
    whole = whole * 10 + digit;
  }
  if (whole > I64_MAX / 100) return -1;
  let minor: i64 = 0;
  if (cents.length >= 1) minor = i64(cents.charCodeAt(0) - 0x30) * 10;
  if (cents.length == 2) minor += i64(cents.charCodeAt(1) - 0x30);
  if (whole * 100 > I64_MAX - minor) return -1;
  return whole * 100 + minor;
}

// 1250 → "12.50".
function decimal(minor: i64): string {
  const sign = minor < 0 ? "-" : "";
  const abs: u64 = minor < 0 ? u64(-minor) : u64(minor);
  const cents = abs % 100;
  return sign + (abs / 100).toString() + "." + (cents < 10 ? "0" : "") + cents.toString();
}

function isCurrency(c: string): bool {
  if (c.length != 3) return false;
  for (let i = 0; i < 3; i++) {
    const b = c.charCodeAt(i);
    if (b < 0x41 || b > 0x5a) return false;
  }
  return true;
}

function authorise(input: eos.Input): void {
  const event = input.event;
  const value = event.value;

  let day = "";
  const spent = new Map<string, i64>();
  const state = input.state;
  if (state !== null) {
    const card = eos.members(state);
    const stored = card.get("day");
    if (stored !== null && stored.isString()) day = stored.string();
    const amounts = card.get("spent");
    if (amounts !== null && !amounts.isNull()) {
      const currencies = eos.members(amounts);
      for (let i = 0; i < currencies.length; i++) {
        spent.set(currencies.name(i), I64.parseInt(currencies.value(i).text()));
      }
    }
  }

  // Go reads the amount as a string: null leaves it empty, anything but a string or null is
  // refused and shown as it came.
  const amountJson = value.get("amount");
  const amountRaw = amountJson === null ? "" : amountJson.text();
  if (amountRaw != "null" && !(amountJson !== null && amountJson.isString())) {
    eos.refuse(
      "invalid_amount",
      "amount " + amountRaw + " is not a decimal string with up to 2 places",
    );
    return;
  }
  const amountText = amountRaw == "null" ? "" : amountJson!.string();
  const amount = minorUnits(amountText);
  if (amount < 0) {
    eos.refuse(
      "invalid_amount",
      "amount " + goQuote(amountText) + " is not a decimal string with up to 2 places",
    );
    return;
  }
  const currencyJson = value.get("currency");
  const currency = currencyJson !== null && currencyJson.isString() ? currencyJson.string() : "";
  if (!isCurrency(currency)) {
    eos.refuse("invalid_currency", "currency is not an ISO 4217 code");
    return;
  }
  // Go measures the length in bytes; a UTC RFC 3339 time is ASCII.
  if (String.UTF8.byteLength(event.occurredAt) < 10) {
    eos.refuse("missing_time", "the authorisation has no /at");
    return;
  }
  const today = event.occurredAt.substring(0, 10);
  if (day != today) {
    day = today;
    spent.clear();
  }
  const before: i64 = spent.has(currency) ? spent.get(currency) : 0;
  const after = before + amount;
  if (after < before || after > DAILY_LIMIT) {
    eos.refuse(
      "over_daily_limit",
      "card " + event.entity + " would spend " + decimal(after) + " " + currency + " on " + day +
        ", over its daily limit of " + decimal(DAILY_LIMIT),
    );
    return;
  }
  spent.set(currency, after);

  const outputs = new Array<eos.Output>();
  if (amount >= FLAG_AT) {
    const flagged = new eos.Output();
    flagged.name = FLAGGED_OUTPUT;
    flagged.value =
      '{"amount":' + eos.quote(amountText) + ',"auth_id":' + eos.quote(event.id) +
      ',"card":' + eos.quote(event.entity) + ',"currency":' + eos.quote(currency) +
      ',"reason":"large_amount"}';
    flagged.headerNames = ["eos-flag"];
    flagged.headerValues = ["large_amount"];
    outputs.push(flagged);
  }
  // The authorisation as it came, approved: the host sets the two members on the event's
  // value, so the module never writes the event again.
  const approved = new eos.Output();
  approved.withNames = ["day_spent", "status"];
  approved.withValues = ['"' + decimal(after) + '"', '"approved"'];
  outputs.push(approved);

  const currencies = spent.keys();
  currencies.sort((a: string, b: string): i32 => (a < b ? -1 : a > b ? 1 : 0));
  let spentJson = "";
  for (let i = 0; i < currencies.length; i++) {
    if (i > 0) spentJson += ",";
    spentJson += eos.quote(currencies[i]) + ":" + spent.get(currencies[i]).toString();
  }
  eos.apply('{"day":' + eos.quote(day) + ',"spent":{' + spentJson + "}}", outputs);
}

export function apply(): i32 {
  authorise(eos.readInput());
  return 0;
}
