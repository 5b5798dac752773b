//! Evaluation: benchmark files, metrics, methods and reports.
//!
//! - [`task`], [`dataset`]: what a task is and one split grouped by user;
//! - [`bench`]: the bundled benchmarks built from packaged real text;
//! - [`lamp`], [`longlamp`]: readers (and the LaMP writer) for those formats;
//! - [`metrics`]: accuracy, macro-F1, depth, breadth, McNemar, bootstrap;
//! - [`rouge`]: ROUGE-1/2/L identical to Python `rouge-score`.
pub mod bench;
pub mod dataset;
pub mod lamp;
pub mod longlamp;
pub mod metrics;
pub mod rouge;
pub mod task;
