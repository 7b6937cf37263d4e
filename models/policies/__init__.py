"""The policies, by the attention kind of the model they decode: `make_policy(cfg, ...)` for one stream,
`policy_class(cfg)` for the rule a model's decoder layers apply. A new policy is a module here with a
`Policy` subclass, registered with `register_policy` (docs/architecture.md shows one)."""
from __future__ import annotations

from models.policies.base import Policy, PolicyError
from models.policies.gma import Gma
from models.policies.offline import Offline
from models.policies.waitk import WaitK

POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Make `cls` the policy of models whose `attention` is `cls.attention` (a class decorator)."""
    POLICIES[cls.attention] = cls
    return cls


for _cls in (Offline, WaitK, Gma):
    register_policy(_cls)


def policy_class(cfg) -> type[Policy]:
    """The policy a model of `cfg` (or of that attention kind, a string) was trained for."""
    attention = cfg if isinstance(cfg, str) else cfg.attention
    try:
        return POLICIES[attention]
    except KeyError:
        raise PolicyError(f"no policy decodes attention {attention!r} (known: {', '.join(POLICIES)})") from None


def policy_named(name: str) -> type[Policy]:
    """The policy whose protocol name is `name` ("gma", "waitk", "offline")."""
    for cls in POLICIES.values():
        if cls.name == name:
            return cls
    raise PolicyError(f"no policy named {name!r} (known: {', '.join(c.name for c in POLICIES.values())})")


def make_policy(cfg, k=None, delta=None, beam: int = 1) -> Policy:
    """The policy a stream of this model runs, with the checkpoint's defaults filled in."""
    if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
        raise PolicyError(f"beam must be an integer >= 1, got {beam!r}")
    cls = policy_class(cfg)
    if beam > 1 and not cls.beams:
        raise PolicyError("beam search is only available for offline models")
    return cls.make(cfg, k=k, delta=delta, beam=beam)


__all__ = ["Policy", "PolicyError", "POLICIES", "register_policy", "policy_class", "policy_named", "make_policy",
           "Offline", "WaitK", "Gma"]
