"""The retraction-order hooks applied to SGLang's real ``ScheduleBatch`` by ``HookRegistry`` (in a child process,
so this test session's SGLang classes stay unpatched)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json
from types import SimpleNamespace
from sglang.srt.managers import schedule_batch
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_iso.integration import fairness, hook_table

schedule_batch.get_schedule = lambda: SimpleNamespace(retraction_policy="length")  # no server config published
hook_table.install([h for h in hook_table.HOOKS if h.target.startswith(hook_table._BATCH)])
HookRegistry.apply_hooks()

def req(owner, rid, prompt, out, done):
    return SimpleNamespace(extra_key=f"iso1.{owner}.x.y", rid=rid, origin_input_ids=[1] * prompt,
                           output_ids=[1] * done, sampling_params=SimpleNamespace(max_new_tokens=out), priority=None,
                           beam_group=None)

reqs = [req("alpha", "a0", 4, 8, 3), req("beta", "b0", 100, 7000, 50), req("alpha", "a1", 4, 8, 2),
        req("beta", "b1", 100, 7000, 60)]
batch = SimpleNamespace(tree_cache=SimpleNamespace(kv_shares=fairness.KvShares(lambda o: 0.5)),
                        token_to_kv_pool_allocator=SimpleNamespace(size=20000), reqs=reqs)
order = lambda: schedule_batch.ScheduleBatch._get_decode_retraction_order(reqs)
seen = {}
def retract(self):
    seen["inside"] = order()
    return [], 0.0, []
fairness.retract_with_shares(retract, batch)
print(json.dumps({"outside": order(), "inside": seen["inside"], "counted": batch.tree_cache.kv_shares.retracted_first,
                  "patched": sorted(t for t in HookRegistry._patched)}))
"""


def test_owners_over_their_share_are_retracted_first_in_sglangs_own_order_function() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # SGLang keeps the longest outputs (beta's) and retracts from the end: alpha's a1 would go first.
    assert [i for i in result["outside"]][-1] == 2, result
    # Within the batch's retraction, beta (14,200 tokens reserved > half of 20,000) is at the end: retracted first.
    assert result["inside"][:2] == [0, 2] and sorted(result["inside"][2:]) == [1, 3], result
    assert result["counted"] == {"beta": 2}
    assert "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order" in result["patched"]
