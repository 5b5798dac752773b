//! Road 2: the LoRA-synthesizing hypernetwork.
//!
//! - [`config`]: hyper-parameters (`hypernet.json`);
//! - [`embedder`]: frozen LLM + embedder LoRA, bidirectional, mean-pooled;
//! - [`heads`]: embedding-to-matrix bottleneck MLPs (parallel or shared trunk);
//! - [`hypernet`]: the whole network, synthesis, save/load;
//! - [`simcse`]: stage 1a contrastive loss;
//! - [`distill`]: vocabulary head + cross-entropy + KL to an ICL teacher;
//! - [`end_to_end`]: stage 1b loss and gradients of one user;
//! - [`targets`]: per-user LoRAs the heads can be trained toward (reconstruction);
//! - [`users`]: benchmark splits / JSONL -> example pairs -> context and target token ids;
//! - [`heldout`]: loss of synthesized LoRAs on held-out users;
//! - [`commit`], [`trainer`]: `hexlora hypertrain` (commits, resume);
//! - [`checkpoints`]: the held-out check and the networks it keeps, a step hook;
//! - [`average`]: the weight-wise mean of checkpoints of one run;
//! - [`eval_method`]: the `hypernet` method of `hexlora eval`.
pub mod average;
pub mod commit;
pub mod checkpoints;
pub mod config;
pub mod distill;
pub mod embedder;
pub mod end_to_end;
pub mod eval_method;
pub mod heads;
pub mod heldout;
pub mod hypernet;
pub mod simcse;
pub mod targets;
pub mod trainer;
pub mod users;

pub use config::{HeadVariant, HyperConfig, Pool};
pub use hypernet::{HyperNet, WeightsDtype};
