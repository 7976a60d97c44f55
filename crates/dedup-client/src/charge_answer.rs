//! What a provider's answer means to the caller: an attempt's outcome, a look-up's finding, and
//! a body cut for reporting. Its own module, so that the provider client and the general HTTP
//! call (`http_call`) both use it without using each other.

/// Longest provider body kept in a rejection or an ambiguous answer's detail, in bytes. dedup-
/// service refuses a `Fail` reason or `MarkUnknown` detail over 4 KiB; a longer one would leave
/// the intent unreported, so it would be re-acquired and POSTed again, forever. This leaves room
/// for the caller's own prefix ("provider answered 402: ").
pub const MAX_REPORTED_BODY_BYTES: usize = 3 * 1024;

/// The provider's record for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeLookup {
    /// The provider applied the charge; its record (JSON).
    Found(Vec<u8>),
    /// The provider has no record of the key (not applied, not yet applied, or forgotten).
    NotFound,
    /// The provider has the request and has not settled it yet: ask again later.
    Pending,
    /// The provider has the request and refused it for good: the answer, cut to
    /// [`MAX_REPORTED_BODY_BYTES`].
    Failed(String),
}

/// What a charge attempt tells the caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// 2xx: applied (or replayed). Report Complete with the body.
    Applied { status: u16, body: Vec<u8> },
    /// A 4xx that means the charge was not applied. Report Fail.
    Rejected {
        status: u16,
        body: String,
        retryable: bool,
    },
    /// Timeout, lost connection, 5xx: it may have been applied. Report MarkUnknown.
    Ambiguous { detail: String },
}

/// The body as text, cut at a char boundary to [`MAX_REPORTED_BODY_BYTES`] with a marker of its
/// original length when longer.
pub fn reported_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if text.len() <= MAX_REPORTED_BODY_BYTES {
        return text.into_owned();
    }
    let marker = format!("… [truncated, {} bytes in all]", body.len());
    let mut end = MAX_REPORTED_BODY_BYTES - marker.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &text[..end])
}
