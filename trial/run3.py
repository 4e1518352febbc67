from trial.h6a import report
import sys
PD = {"pp": 2, "dp": 2}; PT = {"pp": 2, "tp": 2}
LOSSES = ["kl_mean0_sum", "ce_smooth", "ce_sum", "ce_ign0", "ce_shift", "nll", "ce_none_mean", "ce_masked", "ce_per_sample",
          "ce_times2", "ce_zloss", "ce_weighted", "ce_seqmean_first", "ce_max"]
SPECS = [{"name": f"{l} pp2tp2 1f1b m8", "loss": l, "mesh": PT, "steps": 2,
          "opts": {"schedule": "1f1b", "microbatches": 8, "axis_roles": {"tp": "tp"}}} for l in LOSSES]
if __name__ == "__main__":
    sel = sys.argv[1] if len(sys.argv) > 1 else ""
    report([s for s in SPECS if sel in s["name"]])
