import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run, trun, summarize
cases = sys.argv[1:]
C = {
 "ign_mb0": lambda: run("llama_ign0_4", {"pp": 2, "dp": 2}, {"schedule": "1f1b"}, steps=2),
 "ign_shard": lambda: run("llama_ign0_2", {"pp": 2, "dp": 2}, {"schedule": "1f1b"}, steps=2),
 "fn_ign_mb0": lambda: trun("gpt2", {"pp": 2, "dp": 2}, {"schedule": "gpipe"}, {"target_kind": "mb0_ignored", "loss_fn": "lm_loss"}),
 "fn_itemcount_tp": lambda: trun("gpt2", {"pp": 2, "tp": 2}, {"schedule": "1f1b", "axis_roles": {"tp": "tp"}}, {"target_kind": "labels", "loss_fn": "shifted_lm_loss", "item_count": "count_valid"}),
 "fn_shifted_auto": lambda: trun("gpt2", {"pp": 2, "dp": 2}, {"schedule": "1f1b"}, {"target_kind": "labels", "loss_fn": "shifted_lm_loss"}),
 "clip_sched_pp4": lambda: trun("gpt2", {"pp": 4}, {"schedule": "1f1b", "microbatches": 4}, {"target_kind": "labels", "loss_fn": "lm_loss", "clip": 0.05, "sched": True, "steps": 3}),
 "per_sample_mean": lambda: trun("gpt2", {"pp": 2, "dp": 2}, {"schedule": "1f1b"}, {"target_kind": "float", "loss_fn": "per_sample_mean"}),
 "sq_mean": lambda: trun("gpt2", {"pp": 2, "dp": 2}, {"schedule": "1f1b"}, {"target_kind": "float", "loss_fn": "sq_mean"}),
 "mixtral_aux_remedy": lambda: trun("mixtral_aux", {"pp": 2, "dp": 2}, {"schedule": "gpipe"}, {"target_kind": "labels", "loss_fn": None, "item_count": "count_shifted"}),
 "fn_itemcount_ok": lambda: trun("gpt2", {"pp": 2, "tp": 2}, {"schedule": "1f1b", "axis_roles": {"tp": "tp"}}, {"target_kind": "labels", "loss_fn": "shifted_lm_loss", "item_count": "count_shifted"}),
}
if __name__ == "__main__":
    for c in cases:
        summarize(c, C[c]())
