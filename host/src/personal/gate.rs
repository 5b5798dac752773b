//! The gate before a candidate adapter goes live: its mean token loss on
//! a held-out slice of the user's newest examples against the live
//! adapter's. It goes live only if it is not worse; a candidate trained on
//! noise or on someone else's examples raises that loss and is kept aside.
use crate::lora::Adapter;
use crate::train::grad::evaluate;
use crate::autograd::graph::{Batch, TrainableModel};
use crate::Result;

/// How many of `n` new examples are held out: a fifth, at least 1, at
/// most 32 (a gate costs one forward per held-out example).
pub fn heldout_count(n: usize) -> usize {
    n.div_ceil(5).clamp(1, 32).min(n)
}

/// The gate's decision and its figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Mean token loss with the live adapter.
    pub live_loss: f32,
    /// Mean token loss with the candidate.
    pub candidate_loss: f32,
    /// Whether the candidate may go live.
    pub accepted: bool,
    /// The decision in words.
    pub reason: String,
}

/// Judges `candidate` against `live` on `heldout` (dropout off).
pub fn judge(model: &dyn TrainableModel, live: &Adapter, candidate: &Adapter, heldout: &[Batch]) -> Result<Verdict> {
    let live_loss = evaluate(model, live, heldout)?;
    let candidate_loss = evaluate(model, candidate, heldout)?;
    Ok(decide(live_loss, candidate_loss, heldout.len()))
}

/// The rule: finite and not worse.
pub fn decide(live_loss: f32, candidate_loss: f32, examples: usize) -> Verdict {
    let accepted = candidate_loss.is_finite() && (candidate_loss <= live_loss || !live_loss.is_finite());
    let reason = if accepted {
        format!("held-out loss {candidate_loss:.4} is not worse than the live adapter's {live_loss:.4} on {examples} newest examples")
    } else {
        format!("held-out loss {candidate_loss:.4} is worse than the live adapter's {live_loss:.4} on {examples} newest examples: kept aside")
    };
    Verdict { live_loss, candidate_loss, accepted, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_worse_passes_worse_or_non_finite_does_not() {
        assert!(decide(2.0, 1.5, 3).accepted);
        assert!(decide(2.0, 2.0, 3).accepted);
        assert!(!decide(2.0, 2.001, 3).accepted);
        assert!(!decide(2.0, f32::NAN, 3).accepted);
        assert!(decide(f32::NAN, 3.0, 3).accepted, "a broken live adapter is replaced by any finite one");
        assert!(decide(2.0, 2.5, 3).reason.contains("kept aside"));
    }

    #[test]
    fn a_fifth_is_held_out_within_bounds() {
        assert_eq!(heldout_count(1), 1);
        assert_eq!(heldout_count(4), 1);
        assert_eq!(heldout_count(10), 2);
        assert_eq!(heldout_count(11), 3);
        assert_eq!(heldout_count(1000), 32);
    }
}
