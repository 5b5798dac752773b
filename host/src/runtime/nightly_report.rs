//! What the nightly job reports: a `runtime.jsonl` line per step
//! ([`StepRuntime`]) and the end-of-run summary ([`NightlyReport`]:
//! loss curve, where the time went, row retries, throughput, energy).
use crate::npu::NpuStats;
use crate::train::commit::TrainState;
use serde::Serialize;

/// One step's split-runtime figures (`runtime.jsonl`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepRuntime {
    /// 1-based optimizer step.
    pub step: u64,
    /// The step's mean token loss.
    pub loss: f32,
    /// Wall-clock seconds of the step.
    pub seconds: f64,
    /// Step time not spent waiting on the DSP (all CPU nodes, including
    /// CPU-routed products and LoRA work overlapped with requests).
    pub cpu_nodes_s: f64,
    /// Waiting on DSP requests.
    pub dsp_in_flight_s: f64,
    /// CPU work run while a request was in flight.
    pub overlapped_s: f64,
    /// Products routed to the CPU.
    pub cpu_projection_s: f64,
    /// Thermal pause before the step.
    pub pause_before_s: f64,
    /// DSP requests.
    pub dsp_calls: u64,
    /// CPU-routed products.
    pub cpu_calls: u64,
    /// Token rows the DSP was sent (all ops of the step).
    pub rows_sent: u64,
    /// Rows the client had to send again.
    pub row_retries: u64,
    /// Joules over the step, where a meter exists.
    pub energy_j: Option<f64>,
}

/// The end of a nightly run.
pub struct NightlyReport {
    /// The committed state: adapter, history.
    pub state: TrainState,
    /// This invocation's steps (a resumed run's earlier ones are in `state`).
    pub steps: Vec<StepRuntime>,
    /// Seconds paused for heat, and how many pauses.
    pub paused_s: f64,
    /// Thermal pauses taken.
    pub pauses: usize,
    /// The energy meter's source, or why there is none.
    pub energy: Result<String, String>,
    /// The planner's one-line summary.
    pub routes: String,
    /// Why the run fell back to the CPU, if it did.
    pub fallback: Option<String>,
    /// The signal that stopped the run early.
    pub stopped_by: Option<&'static str>,
    /// A `runtime.jsonl` line that could not be written.
    pub write_error: Option<String>,
    /// The DSP service's counters.
    pub service: Option<NpuStats>,
}

impl NightlyReport {
    /// Everything to print at the end: notes, the summary, the service.
    pub fn console(&self) -> String {
        let mut s = String::new();
        if let Some(e) = &self.write_error {
            s += &format!("warning: {e}\n");
        }
        if let Some(reason) = &self.fallback {
            s += &format!("DSP fallback: {reason}; later steps ran on the CPU path\n");
        }
        if let Some(sig) = self.stopped_by {
            s += &format!("{sig}: stopped after step {} (committed); run the same command again to resume\n", self.state.step());
        }
        s += &self.text();
        if let Some(st) = &self.service {
            s += &format!("service: {} requests, {} restarts, {} row retries, {} rows recomputed on the CPU\n", st.requests, st.restarts, st.row_retries, st.rows_failed);
        }
        s
    }

    /// The summary (`summary.txt`).
    pub fn text(&self) -> String {
        let mut s = format!("steps: {} committed ({} in this invocation); routes: {}\n", self.state.step(), self.steps.len(), self.routes);
        s += &self.loss_curve();
        s += &self.time_table();
        s += &self.retries_and_throughput();
        s += &self.energy_line();
        if let Some(f) = &self.fallback {
            s += &format!("fallback: {f}\n");
        }
        s
    }

    /// Ten points of the loss history, first and last included.
    fn loss_curve(&self) -> String {
        let h = &self.state.history;
        if h.is_empty() {
            return String::new();
        }
        let picks: Vec<usize> = (0..h.len().min(10)).map(|i| i * (h.len() - 1) / (h.len().min(10) - 1).max(1)).collect();
        let curve: Vec<String> = picks.iter().map(|&i| format!("{}:{:.4}", h[i].step, h[i].loss)).collect();
        format!("loss curve (step:loss): {}  (loss.svg, metrics.jsonl)\n", curve.join(" "))
    }

    /// `0.0 +`: an empty f64 sum is -0.0.
    fn sum(&self, f: fn(&StepRuntime) -> f64) -> f64 {
        0.0 + self.steps.iter().map(f).sum::<f64>()
    }

    fn time_table(&self) -> String {
        let (total, cpu, dsp) = (self.sum(|r| r.seconds), self.sum(|r| r.cpu_nodes_s), self.sum(|r| r.dsp_in_flight_s));
        let (overl, cpu_proj, pauses) = (self.sum(|r| r.overlapped_s), self.sum(|r| r.cpu_projection_s), 0.0 + self.paused_s);
        let pct = |x: f64| if total + pauses > 0.0 { 100.0 * x / (total + pauses) } else { 0.0 };
        let mut s = format!("time: steps {total:.2} s + pacing pauses {pauses:.2} s ({} pauses)\n", self.pauses);
        s += &format!("  CPU nodes        {cpu:>10.2} s  {:>5.1}%  (of which CPU-routed products {cpu_proj:.2} s, LoRA overlapped with requests {overl:.2} s)\n", pct(cpu));
        s += &format!("  DSP in flight    {dsp:>10.2} s  {:>5.1}%\n", pct(dsp));
        s += &format!("  pacing pauses    {pauses:>10.2} s  {:>5.1}%\n", pct(pauses));
        let later: Vec<f64> = self.steps.iter().skip(1).map(|r| r.seconds).collect();
        if !later.is_empty() {
            s += &format!("step time: mean {:.3} s over {} steps (the first step of this invocation excluded)\n", later.iter().sum::<f64>() / later.len() as f64, later.len());
        }
        s
    }

    /// Tokens of this invocation's steps.
    fn tokens(&self) -> u64 {
        self.state.history.iter().rev().take(self.steps.len()).map(|r| r.tokens).sum()
    }

    fn retries_and_throughput(&self) -> String {
        let retries: Vec<String> = self.steps.iter().map(|r| r.row_retries.to_string()).collect();
        let mut s = format!("row retries per step: [{}]\n", retries.join(", "));
        let (retried, sent) = (self.steps.iter().map(|r| r.row_retries).sum::<u64>(), self.steps.iter().map(|r| r.rows_sent).sum::<u64>());
        if sent > 0 {
            s += &format!("row retries per 1,000 rows: {:.3} ({retried} over {sent} rows sent to the DSP)\n", 1000.0 * retried as f64 / sent as f64);
        }
        let total = self.sum(|r| r.seconds);
        if total > 0.0 {
            s += &format!("throughput: {:.1} tok/s over {} tokens\n", self.tokens() as f64 / total, self.tokens());
        }
        s
    }

    fn energy_line(&self) -> String {
        let source = match &self.energy {
            Err(why) => return format!("energy: not available ({why})\n"),
            Ok(source) => source,
        };
        let parts: Option<Vec<f64>> = self.steps.iter().map(|r| r.energy_j).collect();
        match parts {
            Some(p) if self.tokens() > 0 => {
                let j: f64 = p.iter().sum();
                format!("energy: {j:.2} J in steps, {:.4} J/token ({source})\n", j / self.tokens() as f64)
            }
            _ => format!("energy: not available ({source}: a reading failed during the run)\n"),
        }
    }
}
