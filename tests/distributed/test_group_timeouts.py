"""The mesh's sub-groups wait as long as the world group's timeout says, not torch's 30-minute default.

Round 23 new-user trial: a torchrun job with the user's `init_process_group(timeout=60 s)` and one rank asleep
at step 3 of a (dp=2, tp=2) plan: the other ranks still waited in their dp / tp collectives 8 minutes later
(torch's `new_group` takes the backend's default timeout, 30 minutes for gloo, unless given one).
"""
from group_timeout_workers import ASLEEP_S, TIMEOUT_S, stuck_peer_in_a_sub_group

from parallelizer.runtime import spawn


def test_a_sub_group_collective_times_out_at_the_world_groups_timeout(tmp_path):
    results = spawn(stuck_peer_in_a_sub_group, 3, str(tmp_path / "store"), timeout_s=120)
    waited_s, error = results[0]
    assert error != "no error"
    assert waited_s < ASLEEP_S - 5, f"rank 0 waited {waited_s:.1f} s for a {TIMEOUT_S} s timeout: {error}"
