from trial.h6a import report
import sys
PT = {"pp": 2, "tp": 2}; PD = {"pp": 2, "dp": 2}
LOSSES = ["ce_sum_div_numel", "ce_sum_div_batch", "sq_sum_div_len"]
SPECS = [{"name": f"{l} pp2tp2 1f1b m4", "loss": l, "mesh": PT, "steps": 2,
          "opts": {"schedule": "1f1b", "microbatches": 4, "axis_roles": {"tp": "tp"}}} for l in LOSSES]
SPECS += [{"name": "ce_sum_div_batch pp2dp2 gpipe m2", "loss": "ce_sum_div_batch", "mesh": PD, "steps": 2,
           "opts": {"schedule": "gpipe", "microbatches": 2, "axis_roles": {"dp": "ddp"}}}]
if __name__ == "__main__":
    report(SPECS)
