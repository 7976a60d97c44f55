//! A thread that measures something beside a loop, on a timer, so a gauge keeps moving while the
//! loop is stuck (docs/OBSERVABILITY.md "Liveness"): eos-processor's consumer lag and
//! sink-writer's checkpoint lag. Dropping it stops the thread and joins it, so what the thread
//! borrows (a loop's consumer) is never dropped on it after the loop has gone on.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The thread; dropping this stops it and waits for the measurement in progress.
#[derive(Debug)]
pub struct MeasuringThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MeasuringThread {
    /// Runs `measure` after `first`, then every `every`, until dropped or `measure` breaks.
    /// `measure` is handed the stop flag, to leave a long measurement early.
    pub fn spawn(
        name: &str,
        (first, every): (Duration, Duration),
        mut measure: impl FnMut(&AtomicBool) -> ControlFlow<()> + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut wait = first;
                loop {
                    let until = Instant::now() + wait;
                    while !stopped.load(Ordering::Acquire) && Instant::now() < until {
                        std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
                    }
                    if stopped.load(Ordering::Acquire) || measure(&stopped).is_break() {
                        return;
                    }
                    wait = every;
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for MeasuringThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn it_measures_on_its_timer_until_dropped_and_dropping_waits_for_it() {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        let thread = MeasuringThread::spawn(
            "test-measure",
            (Duration::ZERO, Duration::from_millis(10)),
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                ControlFlow::Continue(())
            },
        )
        .expect("a thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(thread);
        let after_drop = count.load(Ordering::SeqCst);
        assert!(after_drop >= 3, "{after_drop}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            count.load(Ordering::SeqCst),
            after_drop,
            "stopped at the drop"
        );
    }

    #[test]
    fn a_measurement_that_breaks_ends_the_thread() {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        let _thread = MeasuringThread::spawn(
            "test-break",
            (Duration::ZERO, Duration::from_millis(1)),
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                ControlFlow::Break(())
            },
        )
        .expect("a thread");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
