"""What a hybrid projection measured and what it modelled, from its profile (pure).

``provenance(profile, target)`` is the dict the drop-in puts into its Estimate JSON as
``measurement`` and prints: the measured run (the plan's downscale and its memory), the
measured quantities, the modelled ones, and every rule the downscale applied with how
the projection restores what it left out.
"""
from __future__ import annotations

from primus_ext.project.profile import Profile
from primus_ext.spec import RunSpec

# The note a torchtitan measurement writes into its profile (frameworks/torchtitan/
# measure.py); a profile without it is megatron-core's.
TORCHTITAN_NOTE = "framework: torchtitan"


def provenance(profile: Profile, target: RunSpec) -> dict:
    same = profile.hardware == target.cluster.hardware.name
    hw = target.cluster.hardware.name
    measured = ["ops", "collectives with bytes per layer"]
    if any(k.activation_bytes is not None for k in profile.layers.values()):
        measured.append("saved activation bytes per layer")
    if profile.step.get("executed_flops_per_microbatch"):
        measured.append("executed FLOPs")
    framework = "torchtitan" if TORCHTITAN_NOTE in profile.notes else "megatron-core"
    modelled = ["pipeline schedule", "data-parallel sync"]
    if same:
        measured.insert(0, "per-layer forward/backward times of " + "/".join(profile.layers))
        if profile.comm_fits:
            measured.append("collective microbenchmarks (fitted alpha-beta)")
    else:
        modelled[:0] = [f"compute times ({hw} model)",
                        "collective times (comm model)"]
    if profile.step.get("optimizer") == "modelled" or not same:
        modelled.append("optimizer step")
    else:
        measured.append("optimizer step (fits the HBM rate)")
    plan = next((n for n in profile.notes if n.startswith("plan: ")), None)
    return {
        "framework": framework,
        "device": f"{profile.device.get('name')} ({profile.hardware}) x "
                  f"{profile.device.get('count')}",
        "target": f"{target.world_size} x {hw}",
        "times_stand_in": same,
        "plan": plan[len("plan: "):] if plan else None,
        "measured": measured,
        "modelled": modelled,
        "downscale_rules": list(profile.rules),
        "downscale_overrides": list(profile.downscale_overrides),
    }


def provenance_lines(prov: dict) -> list[str]:
    out = [f"measured on {prov['device']}; target {prov['target']}"]
    if prov["plan"]:
        out.append(f"measured run: {prov['plan']}")
    out.append("measured: " + ", ".join(prov["measured"])
               + f" (the downscaled {prov.get('framework', 'megatron-core')} run)")
    out.append("simulated: " + ", ".join(prov["modelled"]))
    out.append("left out by the downscale, and how it is restored"
               + ("" if prov["times_stand_in"] else
                  " (here only the captured checks use it: times are simulated)") + ":")
    out += ["  " + r for r in prov["downscale_rules"]]
    return out
