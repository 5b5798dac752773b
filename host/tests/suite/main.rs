//! hexlora's integration tests, one module a concern, in one test binary
//! (`cargo test -p hexlora --test suite`): one link instead of forty, and
//! libtest spreads every test over the cores. Run one module with a filter:
//! `cargo test -p hexlora --test suite model_smollm2::`.
//!
//! Tests that need something outside the crate (a model, data, qemu, the
//! simulator service) skip with a line saying so, and fail under CI
//! (`support::skip`).

mod support;

// A static musl build of this binary needs it (see the file).
#[cfg(all(target_env = "musl", target_os = "linux"))]
#[path = "../../src/dl_find_object.rs"]
mod dl_find_object;

mod adapter_generate;
mod adapter_gguf_cli;
mod bad_input;
mod cli_output;
mod eval_bench;
mod eval_cli;
mod eval_harness;
mod eval_loaders;
mod eval_metrics;
mod eval_model_methods;
mod eval_report;
mod eval_rouge;
mod eval_trained_methods;
mod firmware_log;
mod layers;
mod fuzz_replay;
mod grad_cli_fixtures;
mod hyper_archs;
mod hyper_eval_method;
mod hyper_grad_fixture;
mod hyper_lamp;
mod hyper_targets;
mod hyper_train_resume;
mod hyper_weights_dtype;
mod hyper_worker;
mod model_fixtures;
mod model_gemma3;
mod model_gguf;
mod model_smollm2;
mod model_tokenizer;
mod npu_fastrpc;
mod npu_grad;
mod npu_transports;
mod personal_round;
mod personalize_job;
mod runtime_energy;
mod runtime_pacing;
mod runtime_planner;
mod serve_http;
mod serve_learn;
mod train_grad_fixtures;
mod train_mezo;
mod train_qwen35;
mod train_resume;
mod train_torture;
