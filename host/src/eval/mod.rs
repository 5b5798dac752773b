//! Evaluation: benchmark files, metrics, methods and reports.
//!
//! - [`task`], [`dataset`]: what a task is and one split grouped by user;
//! - [`bench`]: the bundled benchmarks built from packaged real text;
//! - [`lamp`], [`longlamp`]: readers (and the LaMP writer) for those formats;
//! - [`metrics`]: accuracy, macro-F1, depth, breadth, McNemar, bootstrap;
//! - [`method`]: the `Method` trait every compared method implements, decoding
//!   settings and the temperature sweep; [`baselines`]: model-free methods;
//! - [`model_methods`]: base, ICL, common LoRA, per-user LoRA, MeZO on a
//!   loaded [`model_runtime::EvalModel`] (adapters swapped via [`crate::lora::slots`]);
//! - [`harness`]: runs a method on a split, [`progress`] recording each
//!   finished user so a stopped run resumes; [`result`]: the result file and
//!   method-vs-baseline comparison;
//! - [`report`], [`plot`]: markdown tables and PNG charts of result files;
//! - [`rouge`]: ROUGE-1/2/L identical to Python `rouge-score`.
pub mod baselines;
pub mod bench;
pub mod dataset;
pub mod harness;
pub mod lamp;
pub mod longlamp;
pub mod method;
pub mod metrics;
pub mod model_methods;
pub mod model_runtime;
pub mod plot;
pub mod progress;
pub mod report;
pub mod result;
pub mod rouge;
pub mod task;
