# Sourced by the benchmark scripts: the VM's stolen CPU time (the
# hypervisor running others on these cores) over the whole run, printed
# at its end, since it is what makes rounds disagree. Sourcing records the
# start; `steal_line` prints the share since then (/proc/stat's cpu line:
# user nice system idle iowait irq softirq steal).
steal0=$(awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
steal_line() {
  awk -v a="$steal0" '/^cpu /{split(a, s, " "); t = $2+$3+$4+$5+$6+$7+$8+$9 - s[2]
    printf "steal: %.1f%% of CPU time during the run (/proc/stat)\n", (t > 0 ? 100 * ($9 - s[1]) / t : 0)}' /proc/stat
}
