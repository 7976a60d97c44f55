//! What the benchmarks share (`eos-lab bench sink|relay|dedup|state`): a figure over
//! interleaved rounds, reported as its median and spread, and the machine's load before a run.

use serde::Serialize;

/// A figure over the rounds: each round's value, the median (the mean of the middle two for an
/// even count) and the spread (lowest, highest).
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub rounds: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Figure {
    pub fn new(rounds: Vec<f64>) -> Self {
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Self {
            median,
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            rounds,
        }
    }

    /// Per round `a[i] / b[i]`: a ratio is taken within its round, so drift between rounds hits
    /// both sides alike.
    pub fn ratio(a: &[f64], b: &[f64]) -> Self {
        Self::new(a.iter().zip(b).map(|(a, b)| a / b).collect())
    }

    /// `median` and `lowest–highest` with `digits` decimals, and each round.
    pub fn text(&self, digits: usize) -> (String, String, String) {
        (
            format!("{:.digits$}", self.median),
            format!("{:.digits$}–{:.digits$}", self.min, self.max),
            self.rounds
                .iter()
                .map(|v| format!("{v:.digits$}"))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}

/// `/proc/loadavg` (1, 5, 15 minutes), where there is one: other work on the machine skews every
/// figure, so each report says what it started on.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// The load as `1m 5m 15m`, or `unknown`.
pub fn load_text(load: Option<[f64; 3]>) -> String {
    load.map_or("unknown".to_owned(), |[a, b, c]| {
        format!("{a:.2} {b:.2} {c:.2}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_over_odd_and_even_rounds() {
        let odd = Figure::new(vec![3.0, 1.0, 2.0]);
        assert_eq!((odd.median, odd.min, odd.max), (2.0, 1.0, 3.0));
        assert_eq!(
            odd.rounds,
            vec![3.0, 1.0, 2.0],
            "rounds stay in the order they ran"
        );
        let even = Figure::new(vec![4.0, 1.0, 2.0, 3.0]);
        assert_eq!(even.median, 2.5);
        let ratio = Figure::ratio(&[2.0, 9.0], &[4.0, 3.0]);
        assert_eq!(ratio.rounds, vec![0.5, 3.0]);
        assert_eq!(ratio.text(2).1, "0.50–3.00");
    }
}
