//! LoRA hyper-parameters and their PEFT `adapter_config.json` form.
use crate::{Error, Result};
use serde_json::{json, Value};

/// What PEFT's `LoraConfig` says about an adapter (the subset we support).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank `r`.
    pub r: usize,
    /// `lora_alpha`.
    pub alpha: f32,
    /// Module name suffixes (`q_proj`, `in_proj_qkv`, ...).
    pub target_modules: Vec<String>,
    /// Dropout on the branch input during training.
    pub dropout: f32,
    /// Rank-stabilised scaling `alpha / sqrt(r)` instead of `alpha / r`.
    pub use_rslora: bool,
    /// Recorded as `base_model_name_or_path`.
    pub base_model: String,
}

impl LoraConfig {
    /// The factor applied to the branch output.
    pub fn scaling(&self) -> f32 {
        if self.use_rslora {
            self.alpha / (self.r as f32).sqrt()
        } else {
            self.alpha / self.r as f32
        }
    }

    /// PEFT's rule: a module is targeted when its name equals a target or
    /// ends with `.` + target.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| module == t || module.ends_with(&format!(".{t}")))
    }

    /// `adapter_config.json` as PEFT writes it.
    pub fn to_json(&self) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.use_rslora,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }

    /// Parses `adapter_config.json`, rejecting what we would silently get
    /// wrong (DoRA, biases, per-module ranks, regex targets).
    pub fn from_json(v: &Value, what: &str) -> Result<LoraConfig> {
        let bad = |msg: String| Error::format(what, msg);
        if let Some(t) = v.get("peft_type").and_then(Value::as_str) {
            if t != "LORA" {
                return Err(Error::Unsupported(format!("{what}: peft_type {t} (only LORA)")));
            }
        }
        let r = v.get("r").and_then(Value::as_u64).filter(|&r| r > 0).ok_or_else(|| bad("field r must be a positive integer".into()))?;
        if r > 4096 {
            return Err(bad(format!("field r is {r}, more than 4096")));
        }
        // PEFT's default alpha is 8; a present value must be a number.
        let alpha = match v.get("lora_alpha") {
            None | Some(Value::Null) => 8.0,
            Some(a) => a.as_f64().map(|a| a as f32).filter(|a| a.is_finite() && *a > 0.0).ok_or_else(|| bad(format!("field lora_alpha must be a finite number > 0, got {a}")))?,
        };
        let dropout = match v.get("lora_dropout") {
            None | Some(Value::Null) => 0.0,
            Some(d) => d.as_f64().ok_or_else(|| bad(format!("field lora_dropout must be a number, got {d}")))? as f32,
        };
        if !(0.0..1.0).contains(&dropout) {
            return Err(bad(format!("field lora_dropout {dropout} is outside [0, 1)")));
        }
        let target_modules = match v.get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| t.as_str().map(String::from).ok_or_else(|| bad("target_modules must be strings".into())))
                .collect::<Result<Vec<_>>>()?,
            Some(Value::String(s)) => return Err(Error::Unsupported(format!("{what}: regex target_modules {s:?}"))),
            _ => return Err(bad("missing target_modules".into())),
        };
        if target_modules.is_empty() {
            return Err(bad("field target_modules is empty".into()));
        }
        for (flag, ok) in [("use_dora", false), ("fan_in_fan_out", false)] {
            if v.get(flag).and_then(Value::as_bool).unwrap_or(ok) != ok {
                return Err(Error::Unsupported(format!("{what}: {flag} = true")));
            }
        }
        if v.get("bias").and_then(Value::as_str).unwrap_or("none") != "none" {
            return Err(Error::Unsupported(format!("{what}: LoRA biases")));
        }
        for pattern in ["rank_pattern", "alpha_pattern"] {
            if v.get(pattern).and_then(Value::as_object).is_some_and(|o| !o.is_empty()) {
                return Err(Error::Unsupported(format!("{what}: {pattern}")));
            }
        }
        Ok(LoraConfig {
            r: r as usize,
            alpha,
            target_modules,
            dropout,
            use_rslora: v.get("use_rslora").and_then(Value::as_bool).unwrap_or(false),
            base_model: v.get("base_model_name_or_path").and_then(Value::as_str).unwrap_or("").into(),
        })
    }
}
