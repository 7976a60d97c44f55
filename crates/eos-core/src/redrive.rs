//! Re-drives: an operator's deliberate request that the processor judge a dead-lettered event
//! again (docs/TRANSFORMS.md "Re-driving dead letters"). An event's outcome is final, so a
//! re-delivery of its id is never judged again by itself; a re-drive record — the original
//! record sent to its input partition again by `eosctl dead-letters redrive`, with these headers
//! — is the one exception, and only once per re-drive id.
//!
//! The headers are read by the processor's decision (the id) and by the audit (who, why, which
//! dead letter); they are defined here so both read the same names.

/// On a re-drive record: the id of the operator's act (one `eosctl dead-letters redrive` run).
/// The processor judges an event again for a given re-drive id at most once.
pub const REDRIVE_ID_HEADER: &str = "eos-redrive-id";
/// On a re-drive record: who re-drove it (`--by`).
pub const REDRIVEN_BY_HEADER: &str = "eos-redriven-by";
/// On a re-drive record: why (`--why`: the transform fixed, the limit raised, a ticket).
pub const REDRIVE_REASON_HEADER: &str = "eos-redrive-reason";
/// On a re-drive record: the dead letter it re-drives, as `<topic>/<partition>@<offset>`.
pub const REDRIVE_DEAD_LETTER_HEADER: &str = "eos-redrive-dead-letter";

/// Longest re-drive id: it is kept with the event's outcome for as long as the event id is.
pub const MAX_REDRIVE_ID_BYTES: usize = 64;

/// A re-drive header that cannot be an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "header {REDRIVE_ID_HEADER} is not a re-drive id ({0}): 1 to {MAX_REDRIVE_ID_BYTES} of \
     A-Z a-z 0-9 . _ : -"
)]
pub struct InvalidRedriveId(String);

/// The re-drive id of a record with `headers` (the last header of the name, as every header of
/// the suite is read), or `None` for a record that is no re-drive.
pub fn redrive_id<'a>(
    headers: &[(&str, Option<&'a [u8]>)],
) -> Result<Option<&'a str>, InvalidRedriveId> {
    let Some((_, value)) = headers
        .iter()
        .rev()
        .find(|(name, _)| *name == REDRIVE_ID_HEADER)
    else {
        return Ok(None);
    };
    let value = value.unwrap_or_default();
    let text = std::str::from_utf8(value).map_err(|_| InvalidRedriveId("not UTF-8".to_owned()))?;
    check_redrive_id(text)?;
    Ok(Some(text))
}

/// Whether `id` may be a re-drive id.
pub fn check_redrive_id(id: &str) -> Result<(), InvalidRedriveId> {
    if id.is_empty() || id.len() > MAX_REDRIVE_ID_BYTES {
        return Err(InvalidRedriveId(format!("{} bytes", id.len())));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(InvalidRedriveId(format!("{c:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_id_is_the_last_header_of_its_name_and_must_be_an_id() {
        assert_eq!(redrive_id(&[("event_id", Some(b"e-1"))]), Ok(None));
        assert_eq!(
            redrive_id(&[
                (REDRIVE_ID_HEADER, Some(b"first")),
                (REDRIVE_ID_HEADER, Some(b"rd-20261204-a1")),
            ]),
            Ok(Some("rd-20261204-a1"))
        );
        for bad in [&b""[..], b"has space", b"\xff", &[b'a'; 65]] {
            assert!(
                redrive_id(&[(REDRIVE_ID_HEADER, Some(bad))]).is_err(),
                "{bad:?}"
            );
        }
        assert!(redrive_id(&[(REDRIVE_ID_HEADER, None)]).is_err());
    }
}
