"""API tokens and tenancy.

A token file (YAML) lists who may call the API::

    tokens:
      - name: ops                      # shown in logs instead of the token
        role: operator                 # may do everything
        sha256: 9f86d081884c7d65...    # the token's SHA-256 (or `token:` in clear)
      - name: acme-trainer
        role: tenant
        tenant: acme                   # declares and reads acme's jobs only
        token: s3cret-acme
        gpus: "0-63"                   # optional: the GPUs acme may declare jobs on

Tokens are compared by their SHA-256 digest in constant time and never logged; requests are
logged with the principal's ``name``.

>>> p = Principal("acme-trainer", "tenant", "acme", frozenset({0, 1}))
>>> p.may_use_gpus([0, 1]), p.may_use_gpus([2])
(True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fabricpilot.errors import FabricpilotError
from fabricpilot.scenario.loader import load_strict_yaml, yaml_problem
from fabricpilot.textfiles import UnreadableFile, kind_of, read_text_file
from fabricpilot.units import parse_id_ranges

MAX_TOKEN_FILE_BYTES = 1 << 20
"""The largest token file read (1 MiB: some thousands of tokens)."""


class AuthConfigError(FabricpilotError):
    """A token file that cannot be used (one line: file, field, problem)."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's ``name``, its ``role``, its tenant (tenants only) and the
    GPUs it may declare jobs on (``None``: any)."""

    name: str
    role: Literal["operator", "tenant"]
    tenant: str | None = None
    gpus: frozenset[int] | None = None

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def may_use_gpus(self, gpus: list[int] | tuple[int, ...]) -> bool:
        return self.gpus is None or set(gpus) <= self.gpus

    def owns(self, tenant: str) -> bool:
        return self.is_operator or self.tenant == tenant


class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    role: Literal["operator", "tenant"]
    tenant: str | None = None
    token: str | None = Field(default=None, min_length=16)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    gpus: str | None = None

    @model_validator(mode="after")
    def _check(self) -> _TokenEntry:
        if (self.token is None) == (self.sha256 is None):
            raise ValueError("give exactly one of token or sha256")
        if self.role == "tenant" and not self.tenant:
            raise ValueError("a tenant token needs tenant:")
        if self.role == "operator" and self.tenant is not None:
            raise ValueError("an operator token takes no tenant: (an operator acts for "
                             "every tenant)")
        if self.gpus is not None:
            parse_id_ranges(self.gpus)
        return self


class _TokenFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[_TokenEntry] = Field(min_length=1)


def digest(token: str) -> str:
    """The SHA-256 hex digest a token file may store instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRegistry:
    """Token digest -> :class:`Principal`."""

    def __init__(self, principals: dict[str, Principal] | None = None) -> None:
        self._by_digest = dict(principals or {})
        self._gpu_fields: list[tuple[str, Principal]] = []  # (field, principal) of gpus:

    def gpus_beyond(self, n_gpus: int) -> list[str]:
        """One ``FIELD: PROBLEM`` line per token whose ``gpus:`` name GPUs a fabric of
        ``n_gpus`` does not have (a tenant could never declare a job on them: a typo, or a
        token file written for another fabric).

        >>> reg = TokenRegistry()
        >>> reg._gpu_fields.append(("tokens.1.gpus", Principal("b", "tenant", "b",
        ...                                                    frozenset(range(120, 300)))))
        >>> reg.gpus_beyond(128)
        ["tokens.1.gpus: 172 of b's 180 GPUs are not in the fabric (GPUs 0-127), from GPU 128"]
        """
        out = []
        for field, p in self._gpu_fields:
            beyond = sorted(g for g in p.gpus or () if g >= n_gpus)
            if beyond:
                out.append(f"{field}: {len(beyond)} of {p.name}'s {len(p.gpus or ())} GPUs are "
                           f"not in the fabric (GPUs 0-{n_gpus - 1}), from GPU {beyond[0]}")
        return out

    def add(self, token: str, principal: Principal) -> None:
        self._by_digest[digest(token)] = principal

    def __len__(self) -> int:
        return len(self._by_digest)

    def resolve(self, token: str) -> Principal | None:
        """The principal of ``token``, or None (compared digest by digest in constant time)."""
        d = digest(token)
        found = None
        for known, principal in self._by_digest.items():
            if hmac.compare_digest(known, d):
                found = principal
        return found

    @classmethod
    def from_file(cls, path: str | Path) -> TokenRegistry:
        """Read a token file; a bad one raises :class:`AuthConfigError` naming the field."""
        try:
            raw = load_strict_yaml(read_text_file(path, max_bytes=MAX_TOKEN_FILE_BYTES))
        except UnreadableFile as err:
            raise AuthConfigError(f"{path}: {err}") from None
        except yaml.YAMLError as err:
            raise AuthConfigError(f"{path}: {yaml_problem(err)}") from None
        except (RecursionError, ValueError) as err:
            raise AuthConfigError(f"{path}: cannot read a value: {err}".splitlines()[0]) from None
        if not isinstance(raw, dict):
            got = kind_of(raw)
            raise AuthConfigError(f"{path}: expected a mapping with a 'tokens' list, got {got}")
        try:
            spec = _TokenFile.model_validate(raw)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"]) or "<root>"
            msg = e["msg"].removeprefix("Value error, ")  # (pydantic's word for our checks)
            raise AuthConfigError(f"{path}: {loc}: {msg}") from None
        reg = cls()
        names: dict[str, int] = {}
        for i, e in enumerate(spec.tokens):
            if e.name in names:  # (logs and events name callers: two would be one)
                raise AuthConfigError(f"{path}: tokens.{i}.name: {e.name!r} is also "
                                      f"tokens.{names[e.name]}'s name (a name is one caller's)")
            names[e.name] = i
            gpus = frozenset(parse_id_ranges(e.gpus)) if e.gpus is not None else None
            p = Principal(e.name, e.role, e.tenant, gpus)
            key = e.sha256 or digest(e.token or "")
            if key in reg._by_digest:  # (one would silently replace the other's rights)
                other = reg._by_digest[key].name
                raise AuthConfigError(f"{path}: tokens.{i}: gives the same token as {other!r} (a "
                                      f"token is one caller's)")
            reg._by_digest[key] = p
            if gpus is not None:
                reg._gpu_fields.append((f"tokens.{i}.gpus", p))
        return reg


def new_token() -> str:
    """A fresh random API token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)
