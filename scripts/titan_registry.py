"""Print torchtitan 0.3.0's config registry as the projection reads it: for each row of
primus_ext/frameworks/torchtitan/registry.py, the model fields and inherited defaults read
from torchtitan itself (registry_read.py), and any field where the table differs.

    python scripts/titan_registry.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.frameworks.torchtitan.registry import NOT_MODELLED, REGISTRY  # noqa: E402


def main() -> int:
    from primus_ext.frameworks.torchtitan.registry_read import (model_fields,
                                                                registry_values,
                                                                trainer_config)
    from primus_ext.spec.model import ModelSpec
    derived = {"head_dim": "head_dim", "num_query_groups": "num_groups"}
    bad = 0
    for r in REGISTRY:
        try:
            cfg = trainer_config(r.module, r.config)
        except ImportError as exc:  # float8 converters need torchao
            print(f"{r.module}/{r.config}: not built here ({exc})")
            continue
        theirs = model_fields(cfg.model_spec.model)
        ours = ModelSpec(**r.model_fields())
        diff = {k: (getattr(ours, derived.get(k, k)), v) for k, v in theirs.items()
                if k != "moe_token_dispatcher" and getattr(ours, derived.get(k, k)) != v}
        vals = registry_values(r.module, r.config)
        diff.update({k: (getattr(r, k), v) for k, v in vals.items() if getattr(r, k) != v})
        bad += bool(diff)
        print(f"{r.module}/{r.config} -> model={r.model}"
              f"{' ' + str(dict(r.model_overrides)) if r.model_overrides else ''}: "
              f"{theirs.get('num_layers')} layers, dim {theirs.get('hidden_size')}, "
              f"experts {theirs.get('num_moe_experts')}, "
              f"dispatcher {theirs.get('moe_token_dispatcher')}; defaults {vals}"
              + (f"; DIFFERS (ours, torchtitan's): {diff}" if diff else ""))
    for module, why in NOT_MODELLED.items():
        print(f"{module}: not modelled ({why})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
