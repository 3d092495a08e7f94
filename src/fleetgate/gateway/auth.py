"""API keys and tenants: who is calling, what they may use, and the admin gate.

Keys come from the config (``auth.keys``: ``key`` read from the environment, or
``key_sha256``; ``auth.admin_keys``). Only SHA-256 digests are kept in memory; a presented
key (``Authorization: Bearer <key>``, as OpenAI clients send it) is hashed and looked up,
and the digests are compared with ``hmac.compare_digest``. Keys are never logged: a caller
is named by the key's ``name``.

With no ``auth`` section (or no keys at all) the gateway is open: every caller is the
``anonymous`` tenant with every model and policy, and the lifespan says so loudly.
``/admin/*`` then is open too; with keys configured it needs an admin key.

May touch: hashlib/hmac, config schema, gateway errors. Must not touch: I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetgate.config.auth import AuthConfig, KeyLimits
from fleetgate.gateway.errors import Forbidden, Unauthorized
from fleetgate.state.admission import PRIORITIES, priority_of

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str  # the key's name (never the key)
    tenant: str
    models: frozenset[str] | None = None  # None = every model
    policies: frozenset[str] | None = None  # None = every policy
    limits: KeyLimits = field(default_factory=KeyLimits)
    admin: bool = False
    priority: str | None = None  # the key's class (None: an open gateway, x-priority decides)
    weight: float = 1.0
    unlimited: bool = field(init=False)  # no limit set: admission has nothing to count

    def __post_init__(self) -> None:
        object.__setattr__(self, "unlimited", self.limits == KeyLimits())

    def priority_for(self, header: str | None) -> str:
        """The class a request waits in: the key's, or a lower one the client asks for
        with ``x-priority``; without keys the header decides (normal when absent)."""
        asked = priority_of(header, self.priority or "normal")
        if self.priority is None:
            return asked
        return max(asked, self.priority, key=PRIORITIES.index)

    def check_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise Forbidden(f"key {self.name!r} may not use model {model!r}", param="model")

    def check_policy(self, policy: str | None) -> None:
        if policy is not None and self.policies is not None and policy not in self.policies:
            raise Forbidden(f"key {self.name!r} may not use policy {policy!r}",
                            param="x-fleetgate-policy")


OPEN = Principal(ANONYMOUS, ANONYMOUS, admin=True)


def sha256_hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyTable:
    def __init__(self, auth: AuthConfig | None) -> None:
        self._keys: list[tuple[bytes, Principal]] = []
        self._admin: list[bytes] = []
        if auth is None:
            return
        for k in auth.keys:
            digest = bytes.fromhex(k.key_sha256 or sha256_hex(k.key or ""))
            self._keys.append((digest, Principal(
                k.name, k.tenant, frozenset(k.models) if k.models is not None else None,
                frozenset(k.policies) if k.policies is not None else None, k.limits,
                priority=k.priority, weight=k.weight)))
        self._admin = [bytes.fromhex(sha256_hex(a)) for a in auth.admin_keys if a]

    @property
    def open(self) -> bool:
        return not self._keys and not self._admin

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller of an API route; raises Unauthorized on a missing or unknown key."""
        if self.open:
            return OPEN
        digest = _bearer_digest(headers)
        if digest is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        found = None
        for known, principal in self._keys:  # every digest compared, in constant time
            if hmac.compare_digest(known, digest):
                found = principal
        if found is not None:
            return found
        if self._is_admin(digest):
            return Principal("admin", ANONYMOUS, admin=True)
        raise Unauthorized("invalid API key")

    def authorize_admin(self, headers: Mapping[str, str]) -> None:
        if self.open:
            return
        digest = _bearer_digest(headers)
        if digest is None:
            raise Unauthorized("admin routes need an admin key: 'Authorization: Bearer <key>'")
        if not self._is_admin(digest):
            raise Forbidden("this key may not use the admin API")

    def _is_admin(self, digest: bytes) -> bool:
        return any([hmac.compare_digest(digest, a) for a in self._admin])


def _bearer_digest(headers: Mapping[str, str]) -> bytes | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return hashlib.sha256(token.strip().encode()).digest()
