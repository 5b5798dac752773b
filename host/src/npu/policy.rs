//! Which precision each frozen projection is resident in on the NPU.
//!
//! The mission's policy: Gated DeltaNet (recurrent) projections FP16,
//! because the recurrent state carries quantization error into later
//! tokens; attention and MLP projections Q8_0. An attention-only model has
//! no recurrent projection, so the same policy makes it all Q8_0.
//! Activations stay floating point whatever the weight precision.
use crate::projection::ProjectionKind;
use crate::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Storage of a resident weight on the NPU: the protocol's own type.
pub use hexlora_proto::protocol::Precision;

/// `f16` (or `fp16`) and `q8_0` (or `q8`), any case.
pub fn parse_precision(s: &str) -> Result<Precision> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f16" | "fp16" => Ok(Precision::Fp16),
        "q8_0" | "q8" => Ok(Precision::Q8_0),
        other => Err(Error::invalid("precision", format!("'{other}' (expected f16 or q8_0)"))),
    }
}

/// Precision per projection kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrecisionPolicy {
    /// q/k/v/o.
    pub attention: Precision,
    /// gate/up/down.
    pub mlp: Precision,
    /// Gated DeltaNet in/out projections.
    pub recurrent: Precision,
}

impl Default for PrecisionPolicy {
    /// The mission's policy: recurrent F16, attention and MLP Q8_0.
    fn default() -> Self {
        PrecisionPolicy { attention: Precision::Q8_0, mlp: Precision::Q8_0, recurrent: Precision::Fp16 }
    }
}

impl PrecisionPolicy {
    /// Every kind in `p`.
    pub fn uniform(p: Precision) -> Self {
        PrecisionPolicy { attention: p, mlp: p, recurrent: p }
    }

    /// The precision for a projection of `kind`.
    pub fn for_kind(&self, kind: ProjectionKind) -> Precision {
        match kind {
            ProjectionKind::Attention => self.attention,
            ProjectionKind::Mlp => self.mlp,
            ProjectionKind::Recurrent => self.recurrent,
        }
    }

    /// Parses the CLI form: `default` (the mission's policy), one precision
    /// for everything (`f16`, `q8_0`), or comma-separated overrides of the
    /// default such as `attention=f16,recurrent=q8_0`.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("default") {
            return Ok(Self::default());
        }
        if !s.contains('=') {
            return Ok(Self::uniform(parse_precision(s)?));
        }
        let mut policy = Self::default();
        for part in s.split(',') {
            let (kind, p) = part
                .split_once('=')
                .ok_or_else(|| Error::invalid("precision policy", format!("'{part}' is not kind=precision")))?;
            let p = parse_precision(p)?;
            match kind.trim().to_ascii_lowercase().as_str() {
                "attention" | "attn" => policy.attention = p,
                "mlp" => policy.mlp = p,
                "recurrent" | "gdn" => policy.recurrent = p,
                other => {
                    return Err(Error::invalid(
                        "precision policy",
                        format!("unknown projection kind '{other}' (expected attention, mlp or recurrent)"),
                    ))
                }
            }
        }
        Ok(policy)
    }
}

impl FromStr for PrecisionPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for PrecisionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attention={},mlp={},recurrent={}", self.attention, self.mlp, self.recurrent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_missions_policy() {
        let p = PrecisionPolicy::default();
        assert_eq!(p.for_kind(ProjectionKind::Recurrent), Precision::Fp16);
        assert_eq!(p.for_kind(ProjectionKind::Attention), Precision::Q8_0);
        assert_eq!(p.for_kind(ProjectionKind::Mlp), Precision::Q8_0);
    }

    #[test]
    fn parses_cli_forms_and_round_trips() {
        assert_eq!(PrecisionPolicy::parse("default").unwrap(), PrecisionPolicy::default());
        assert_eq!(PrecisionPolicy::parse("F16").unwrap(), PrecisionPolicy::uniform(Precision::Fp16));
        let p = PrecisionPolicy::parse("attention=f16, recurrent=q8_0").unwrap();
        assert_eq!((p.attention, p.mlp, p.recurrent), (Precision::Fp16, Precision::Q8_0, Precision::Q8_0));
        assert_eq!(PrecisionPolicy::parse(&p.to_string()).unwrap(), p);
        for bad in ["q4", "attention=q4", "conv=f16", "attention"] {
            let e = PrecisionPolicy::parse(bad).unwrap_err().to_string();
            assert!(e.contains("precision"), "{bad}: {e}");
        }
    }

    #[test]
    fn weight_bytes_per_precision() {
        assert_eq!(Precision::Fp16.weight_bytes(3, 64), Some(384));
        assert_eq!(Precision::Q8_0.weight_bytes(3, 64), Some(3 * 2 * 34));
        assert_eq!(Precision::Q8_0.weight_bytes(3, 48), None);
    }
}
