from trial.h6a import report
PT = {"pp": 2, "tp": 2}
SPECS = [{"name": f"own {k} pp2tp2 1f1b m4", "model": f"own_{k}", "own": True, "mesh": PT, "steps": 2,
          "opts": {"schedule": "1f1b", "microbatches": 4, "axis_roles": {"tp": "tp"}}} for k in ("div_batch", "mean0_sum")]
if __name__ == "__main__":
    report(SPECS)
