//! How an entity's state is stored, in the changelog and in the local store: the transform's
//! state as JSON, with the version of its format ([`Transform::STATE_VERSION`]).
//!
//! Version 1 is stored as the bare JSON, which is what every changelog written before versions
//! existed holds, so those keep restoring. A later version is stored as
//! `{"eos_state_version":N,"state":…}`. A state of another version than the transform's is
//! handed to [`Transform::upgrade_state`], whose default refuses: a restore then stops with an
//! error that says which versions met, instead of misreading the state (serde would quietly
//! drop or default fields).

use serde_json::Value;

use crate::transform::Transform;

/// What a versioned state starts with, byte for byte (the encoder writes it this way).
const VERSIONED_PREFIX: &[u8] = b"{\"eos_state_version\":";

/// The stored bytes of `state`.
pub fn encode<T: Transform>(state: &T::State) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec(state)?;
    if T::STATE_VERSION == 1 {
        return Ok(json);
    }
    let mut stored = Vec::with_capacity(json.len() + 40);
    stored.extend_from_slice(VERSIONED_PREFIX);
    stored.extend_from_slice(T::STATE_VERSION.to_string().as_bytes());
    stored.extend_from_slice(b",\"state\":");
    stored.extend_from_slice(&json);
    stored.push(b'}');
    Ok(stored)
}

/// The state stored as `bytes`, upgraded by the transform when it was written with another
/// version of its format.
pub fn decode<T: Transform>(transform: &T, bytes: &[u8]) -> Result<T::State, String> {
    let (version, json): (u32, Value) = if bytes.starts_with(VERSIONED_PREFIX) {
        #[derive(serde::Deserialize)]
        struct Versioned {
            eos_state_version: u32,
            state: Value,
        }
        let versioned: Versioned = serde_json::from_slice(bytes)
            .map_err(|e| format!("versioned state does not decode: {e}"))?;
        (versioned.eos_state_version, versioned.state)
    } else if T::STATE_VERSION == 1 {
        // The common case, read straight into the state without an intermediate `Value`.
        let state =
            serde_json::from_slice(bytes).map_err(|e| format!("state does not decode: {e}"))?;
        return transform
            .admit_state(state)
            .map_err(|error| error.to_string());
    } else {
        let json = serde_json::from_slice(bytes).map_err(|e| format!("state is not JSON: {e}"))?;
        (1, json)
    };
    let state = if version == T::STATE_VERSION {
        serde_json::from_value(json).map_err(|e| format!("state does not decode: {e}"))?
    } else {
        transform
            .upgrade_state(version, json)
            .map_err(|error| error.to_string())?
    };
    transform
        .admit_state(state)
        .map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::transform::{LedgerTotals, LedgerTransform, Output, Refusal, SourcePosition};
    use eos_core::Event;

    /// Version 2 of a points balance: `points` became `balance`.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    struct Balance {
        balance: i64,
    }

    struct PointsV2 {
        upgrades: bool,
    }

    impl Transform for PointsV2 {
        type State = Balance;
        const STATE_VERSION: u32 = 2;

        fn apply(
            &self,
            _state: &mut Balance,
            _event: Event,
            _source: &SourcePosition,
        ) -> Result<Vec<Output>, Refusal> {
            Ok(Vec::new())
        }

        fn upgrade_state(
            &self,
            from_version: u32,
            state: Value,
        ) -> Result<Balance, crate::transform::StateUpgradeError> {
            if !self.upgrades || from_version != 1 {
                return Err(crate::transform::StateUpgradeError(format!(
                    "no upgrade from {from_version}"
                )));
            }
            Ok(Balance {
                balance: state["points"].as_i64().unwrap_or_default(),
            })
        }
    }

    #[test]
    fn version_one_is_the_bare_json_older_changelogs_hold() -> Result<(), String> {
        let totals = LedgerTotals { total: 5, count: 1 };
        let stored = encode::<LedgerTransform>(&totals).map_err(|e| e.to_string())?;
        assert_eq!(stored, br#"{"total":5,"count":1}"#);
        assert_eq!(decode(&LedgerTransform, &stored)?, totals);
        Ok(())
    }

    #[test]
    fn a_later_version_round_trips_and_an_older_one_needs_an_upgrade() -> Result<(), String> {
        let transform = PointsV2 { upgrades: false };
        let stored = encode::<PointsV2>(&Balance { balance: 7 }).map_err(|e| e.to_string())?;
        assert_eq!(stored, br#"{"eos_state_version":2,"state":{"balance":7}}"#);
        assert_eq!(decode(&transform, &stored)?, Balance { balance: 7 });
        // Written by version 1 (bare): refused without an upgrade, upgraded with one.
        let old = br#"{"points":40}"#;
        let refused = decode(&transform, old).expect_err("no upgrade");
        assert!(refused.contains("no upgrade from 1"), "{refused}");
        assert_eq!(
            decode(&PointsV2 { upgrades: true }, old)?,
            Balance { balance: 40 }
        );
        // A version-1 transform never misreads version-2 state as its own.
        let refused = decode(&LedgerTransform, &stored).expect_err("another version");
        assert!(refused.contains("version 2"), "{refused}");
        assert!(refused.contains("is 1"), "{refused}");
        Ok(())
    }
}
