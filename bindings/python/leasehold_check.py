"""leasehold_check: a sandbox's check of its own lease, for Python runtimes.

ctypes over libleasehold-check (include/leasehold/check.h, the library's C ABI); the standard
library alone. The supervisor starts every sandbox with its lease in the environment:
LEASEHOLD_SHM (the shm epoch table: "3", an inherited read-only descriptor, or a path),
LEASEHOLD_SLOT (its slot), LEASEHOLD_EPOCH (its name's epoch; 0 when started unnamed),
LEASEHOLD_SANDBOX (its id), LEASEHOLD_NAME (its name, when started named) and LEASEHOLD_TOKENS
(its token channel, "4").

    import leasehold_check as lh

    lease = lh.Lease.from_env()
    with lh.Table.open() as table:
        epoch = lease.epoch or table.current_epoch()   # None until the sandbox is named
        if epoch is None or not table.check_deadline(lease.slot, epoch):
            raise SystemExit("not the holder: no side effect")

Errors raise LeaseholdError: `.code` is the library's LEASEHOLD_E_* value (E_MISSING, ...),
`.message` its message. The library is loaded once, on first use: $LEASEHOLD_CHECK_LIBRARY
(a path, e.g. a build tree's) or the dynamic loader's "libleasehold-check.so.1". A table, a
token channel and a verifier are thread-safe (the library's guarantee); close() is not
concurrent with their other calls.

Which epoch is the fencing token (bindings/README.md, docs/PROTOCOL.md "Sandbox runtimes"):
LEASEHOLD_EPOCH when it is not 0; a sandbox started unnamed and named later learns its epoch from
its own slot (Table.current_epoch), once, and then checks that epoch like any other.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
import uuid
from typing import Mapping, Optional, Tuple, Union

__all__ = [
    "LeaseholdError", "Lease", "SlotSnapshot", "Table", "Tokens", "Verifier", "version", "strerror",
    "LIBRARY_ENV", "DEFAULT_LIBRARY", "TOKEN_BYTES",
]

# ---- constants of check.h (stable values) ----------------------------------------------------

OK = 0
E_MISSING = -1       # no table at the location (or LEASEHOLD_SHM unset)
E_TRUNCATED = -2     # file smaller than its header says
E_BAD_MAGIC = -3     # not a leasehold table
E_VERSION = -4       # incompatible layout major version
E_GEOMETRY = -5      # inconsistent header
E_NOT_READY = -6     # the writer has not finished creating it
E_BAD_SLOT = -7      # slot index out of range
E_NOT_FOUND = -8     # no slot for that sandbox (or no token for that epoch)
E_IO = -9            # the OS refused (permission, ...)
E_ARG = -10          # malformed argument
E_BUSY = -11         # slot kept changing; retry
E_TOKEN_UNSIGNED = -12
E_TOKEN_MALFORMED = -13
E_TOKEN_UNKNOWN_KEY = -14
E_TOKEN_BAD_SIGNATURE = -15
E_TOKEN_WRONG_NAME = -16
E_TOKEN_WRONG_EPOCH = -17
E_TOKEN_WRONG_HOLDER = -18

SLOT_FREE = 0
SLOT_CLAIMED = 1
SLOT_PUBLISHED = 2
SLOT_COOLING = 3
SLOT_UNKNOWN = 0xFFFFFFFF

TOKEN_BYTES = 140
REVOKED_BIT = 1 << 63

LIBRARY_ENV = "LEASEHOLD_CHECK_LIBRARY"
DEFAULT_LIBRARY = "libleasehold-check.so.1"
ABI_MAJOR = 1            # the soname's major this module speaks
_ERR_BYTES = 512         # room for the library's messages
_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1


class LeaseholdError(Exception):
    """A libleasehold-check error: `code` is its LEASEHOLD_E_* value (negative), `message` the
    library's message (or the call and the code's text where the call has none)."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({strerror(self.code)}, code {self.code})"


# ---- the library -----------------------------------------------------------------------------


class _SlotInfo(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("revoked", ctypes.c_uint32),
        ("epoch", ctypes.c_uint64),
        ("sandbox_id", ctypes.c_uint8 * 16),
        ("name_id", ctypes.c_uint8 * 16),
        ("valid_until_ns", ctypes.c_uint64),
        ("name_bytes", ctypes.c_uint32),
        ("name_prefix", ctypes.c_char * 8),
    ]


assert ctypes.sizeof(_SlotInfo) == 80, "leasehold_slot_info is 80 bytes (check_c.cpp static_assert)"

_lib_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _declare(lib: ctypes.CDLL) -> None:
    p, u32, u64, i64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
    cs, sz, i = ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
    u8p = ctypes.POINTER(ctypes.c_uint8)
    sigs = {
        "leasehold_check_version": (cs, []),
        "leasehold_strerror": (cs, [i]),
        "leasehold_open": (i, [cs, u32, ctypes.POINTER(p), cs, sz]),
        "leasehold_close": (None, [p]),
        "leasehold_slot_count": (u32, [p]),
        "leasehold_check_slot": (i, [p, u32, u64]),
        "leasehold_check_deadline": (i, [p, u32, u64]),
        "leasehold_writer_alive": (i, [p, ctypes.POINTER(u64)]),
        "leasehold_snapshot": (i, [p, u32, ctypes.POINTER(_SlotInfo)]),
        "leasehold_find_sandbox": (i64, [p, cs]),
        "leasehold_tokens_open": (i, [cs, ctypes.POINTER(p), cs, sz]),
        "leasehold_tokens_close": (None, [p]),
        "leasehold_token": (i, [p, u64, u8p, sz]),
        "leasehold_verifier_new": (p, []),
        "leasehold_verifier_free": (None, [p]),
        "leasehold_verifier_add_key_file": (i, [p, cs, cs, sz]),
        "leasehold_verifier_add_key": (i, [p, u8p, sz]),
        "leasehold_verify": (i, [p, u8p, sz, cs, u64, cs, cs, sz]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _library() -> ctypes.CDLL:
    """The loaded library (loaded and checked on first use)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            path = os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise LeaseholdError(E_MISSING, f"cannot load {path}: {e} "
                                                f"(install libleasehold-check{ABI_MAJOR}, or set {LIBRARY_ENV})") from e
            _declare(lib)
            have = lib.leasehold_check_version().decode()
            if have.split(".")[0] != str(ABI_MAJOR):
                raise LeaseholdError(E_VERSION, f"{path} is libleasehold-check {have}; this module needs {ABI_MAJOR}.x")
            _lib = lib
        return _lib


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH" (leasehold_check_version)."""
    return _library().leasehold_check_version().decode()


def strerror(code: int) -> str:
    """The library's stable text of a LEASEHOLD_E_* code."""
    if not -(1 << 31) <= code < (1 << 31):
        return "unknown leasehold error"
    return _library().leasehold_strerror(code).decode()


def _fail(code: int, err: Optional[ctypes.Array], what: str) -> LeaseholdError:
    msg = err.value.decode(errors="replace") if err is not None else ""
    return LeaseholdError(code, msg or f"{what}: {strerror(code)}")


def _text(value: Union[str, os.PathLike, None], what: str) -> Optional[bytes]:
    if value is None:
        return None
    b = os.fsencode(value)
    if b"\0" in b:
        raise LeaseholdError(E_ARG, f"{what} contains a NUL byte")
    return b


def _in_range(v: int, hi: int) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an int, got {type(v).__name__}")
    return 0 <= v <= hi


def _uuid_text(value: Union[str, uuid.UUID]) -> bytes:
    return _text(str(value), "sandbox id") or b""


def _env_int(env: Mapping[str, str], key: str, hi: int) -> int:
    raw = env.get(key, "")
    if raw == "":
        raise LeaseholdError(E_MISSING, f"{key} is not set (the supervisor sets it in every sandbox it starts)")
    if not (raw.isascii() and raw.isdigit()) or int(raw) > hi:
        raise LeaseholdError(E_ARG, f"{key}={raw!r} is not a number in [0, {hi}]")
    return int(raw)


def _parse_uuid(value: Union[str, uuid.UUID], what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except ValueError:
        raise LeaseholdError(E_ARG, f"{what} {value!r} is not a UUID") from None


def _env_sandbox(env: Mapping[str, str]) -> uuid.UUID:
    raw = env.get("LEASEHOLD_SANDBOX", "")
    if raw == "":
        raise LeaseholdError(E_MISSING, "LEASEHOLD_SANDBOX is not set (the supervisor sets it in every sandbox it starts)")
    return _parse_uuid(raw, "LEASEHOLD_SANDBOX")


# ---- the lease in the environment ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Lease:
    """A sandbox's lease as its supervisor gave it (the environment at start).

    epoch is 0 for a sandbox started unnamed: named later, it learns its epoch from its own slot
    (Table.current_epoch). name is None then too (LEASEHOLD_NAME is set only at start)."""

    location: str                  # LEASEHOLD_SHM
    slot: int                      # LEASEHOLD_SLOT
    epoch: int                     # LEASEHOLD_EPOCH (0: started unnamed)
    sandbox: uuid.UUID             # LEASEHOLD_SANDBOX
    name: Optional[str] = None     # LEASEHOLD_NAME
    tokens: Optional[str] = None   # LEASEHOLD_TOKENS

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Lease":
        """Reads the lease from `environ` (default os.environ). Raises LeaseholdError: E_MISSING
        when a variable is unset, E_ARG when one is malformed."""
        env = os.environ if environ is None else environ
        location = env.get("LEASEHOLD_SHM", "")
        if location == "":
            raise LeaseholdError(E_MISSING, "LEASEHOLD_SHM is not set: not started by a leasehold supervisor")
        return cls(location=location,
                   slot=_env_int(env, "LEASEHOLD_SLOT", _U32_MAX),
                   epoch=_env_int(env, "LEASEHOLD_EPOCH", REVOKED_BIT - 1),
                   sandbox=_env_sandbox(env),
                   name=env.get("LEASEHOLD_NAME") or None,
                   tokens=env.get("LEASEHOLD_TOKENS") or None)

    def open(self, wait_ms: int = 1000) -> "Table":
        """The table this lease is in (Table.open(self.location, wait_ms))."""
        return Table.open(self.location, wait_ms)


# ---- the table -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SlotSnapshot:
    """A consistent copy of one slot (leasehold_slot_info)."""

    index: int
    generation: int          # +1 each time the slot is claimed
    state: int               # SLOT_FREE / SLOT_CLAIMED / SLOT_PUBLISHED / SLOT_COOLING / SLOT_UNKNOWN
    revoked: bool
    epoch: int               # 0: none published
    sandbox_id: uuid.UUID
    name_id: uuid.UUID
    valid_until_ns: int      # CLOCK_BOOTTIME (time.clock_gettime_ns(time.CLOCK_BOOTTIME))
    name_bytes: int          # the name's full length
    name_prefix: str         # its first bytes

    @property
    def published(self) -> bool:
        """Published and not revoked: the epoch is a live grant's."""
        return self.state == SLOT_PUBLISHED and not self.revoked and self.epoch > 0


class _Handle:
    """A library object owned by a Python object: close() frees it once (`_free` names the C
    function), a context manager closes it, and so does garbage collection. `_h()` is the handle,
    or LeaseholdError E_ARG once closed (`_what` names the object in that message)."""

    _free = ""
    _what = ""

    def __init__(self, handle) -> None:
        self._lib = _library()
        self._handle = handle

    def close(self) -> None:
        if self._handle:
            getattr(self._lib, self._free)(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self.close()

    def _h(self):
        if not self._handle:
            raise LeaseholdError(E_ARG, f"the {self._what} is closed")
        return self._handle


class Table(_Handle):
    """A read-only mapping of a supervisor's shm epoch table (leasehold_open). A context manager;
    close() unmaps it (later calls raise LeaseholdError E_ARG)."""

    _free = "leasehold_close"
    _what = "table"

    def __init__(self, handle: ctypes.c_void_p, location: Optional[str]):
        super().__init__(handle)
        self.location = location

    @classmethod
    def open(cls, location: Union[str, os.PathLike, None] = None, wait_ms: int = 1000) -> "Table":
        """Opens the table at `location` (a descriptor number such as "3", a shm name, or an
        absolute path); None means $LEASEHOLD_SHM. Waits up to wait_ms for it to appear and
        become ready. Raises LeaseholdError (E_MISSING, E_IO, E_BAD_MAGIC, ...)."""
        lib = _library()
        if not _in_range(wait_ms, _U32_MAX):
            raise LeaseholdError(E_ARG, f"wait_ms {wait_ms} outside [0, {_U32_MAX}]")
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_ERR_BYTES)
        rc = lib.leasehold_open(_text(location, "location"), wait_ms, ctypes.byref(handle), err, _ERR_BYTES)
        if rc != OK:
            raise _fail(rc, err, "leasehold_open")
        return cls(handle, None if location is None else os.fsdecode(location))


    @property
    def slot_count(self) -> int:
        return self._lib.leasehold_slot_count(self._h())

    def check(self, slot: int, epoch: int) -> bool:
        """True when `slot` holds `epoch` (published, not revoked): one load and a compare, no
        clock, so it cannot see a dead writer or a passed deadline (check_deadline can)."""
        h = self._h()
        return _in_range(slot, _U32_MAX) and _in_range(epoch, _U64_MAX) and \
            self._lib.leasehold_check_slot(h, slot, epoch) == 1

    def check_deadline(self, slot: int, epoch: int) -> bool:
        """check(), and: its valid-until not passed, the writer's heartbeat fresh, the table not
        closed. Call it before every side effect that must be fenced."""
        h = self._h()
        return _in_range(slot, _U32_MAX) and _in_range(epoch, _U64_MAX) and \
            self._lib.leasehold_check_deadline(h, slot, epoch) == 1

    def writer_alive(self) -> Tuple[bool, int]:
        """(alive, heartbeat age in ns); the age is 2**64 - 1 when there is no heartbeat."""
        age = ctypes.c_uint64()
        alive = self._lib.leasehold_writer_alive(self._h(), ctypes.byref(age))
        return alive == 1, age.value

    def snapshot(self, slot: int) -> SlotSnapshot:
        """A consistent copy of `slot`. Raises LeaseholdError E_BAD_SLOT / E_BUSY."""
        h = self._h()
        if not _in_range(slot, _U32_MAX):
            raise LeaseholdError(E_BAD_SLOT, f"slot {slot} is out of range")
        info = _SlotInfo()
        rc = self._lib.leasehold_snapshot(h, slot, ctypes.byref(info))
        if rc != OK:
            raise _fail(rc, None, f"leasehold_snapshot(slot {slot})")
        return SlotSnapshot(index=info.index, generation=info.generation, state=info.state,
                            revoked=info.revoked != 0, epoch=info.epoch,
                            sandbox_id=uuid.UUID(bytes=bytes(info.sandbox_id)),
                            name_id=uuid.UUID(bytes=bytes(info.name_id)),
                            valid_until_ns=info.valid_until_ns, name_bytes=info.name_bytes,
                            name_prefix=info.name_prefix.decode(errors="replace"))

    def find_sandbox(self, sandbox: Union[str, uuid.UUID]) -> int:
        """The slot of a sandbox (UUID, or its text in any case, dashes optional). Raises
        LeaseholdError E_NOT_FOUND (no slot for it) / E_ARG (not a UUID)."""
        rc = self._lib.leasehold_find_sandbox(self._h(), _uuid_text(sandbox))
        if rc < 0:
            raise _fail(rc, None, f"leasehold_find_sandbox({sandbox})")
        return rc

    def current_epoch(self, slot: Optional[int] = None,
                      sandbox: Union[str, uuid.UUID, None] = None) -> Optional[int]:
        """The epoch published in this sandbox's own slot, or None.

        slot and sandbox default to $LEASEHOLD_SLOT and $LEASEHOLD_SANDBOX. The epoch is returned
        only when the slot's sandbox id is `sandbox` and the slot is published and not revoked;
        None otherwise (not named yet, revoked, or another sandbox's slot). For a sandbox started
        unnamed (LEASEHOLD_EPOCH=0): the slot is its own from start to exit, so an epoch
        published there is the grant of its name. Learn it once, then check that epoch (check,
        check_deadline) and present it as the fencing token; do not re-read it before each check:
        the check is against the grant it learnt (bindings/README.md)."""
        env = os.environ
        if slot is None:
            slot = _env_int(env, "LEASEHOLD_SLOT", _U32_MAX)
        own = _env_sandbox(env) if sandbox is None else _parse_uuid(sandbox, "sandbox")
        s = self.snapshot(slot)
        if s.sandbox_id != own or not s.published:
            return None
        return s.epoch


# ---- tokens and their verification -----------------------------------------------------------


class Tokens(_Handle):
    """The sandbox's own token channel (leasehold_tokens_open): the signed tokens of its grants.
    A context manager."""

    _free = "leasehold_tokens_close"
    _what = "token channel"

    @classmethod
    def open(cls, location: Optional[str] = None) -> "Tokens":
        """Opens the channel at `location` (the inherited descriptor's number, "4"); None means
        $LEASEHOLD_TOKENS. Raises LeaseholdError (E_MISSING when unset, ...)."""
        lib = _library()
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_ERR_BYTES)
        rc = lib.leasehold_tokens_open(_text(location, "location"), ctypes.byref(handle), err, _ERR_BYTES)
        if rc != OK:
            raise _fail(rc, err, "leasehold_tokens_open")
        return cls(handle)

    def token(self, epoch: int) -> bytes:
        """The signed token of this sandbox's grant at `epoch` (TOKEN_BYTES bytes). Raises
        LeaseholdError E_NOT_FOUND (no token for that epoch), E_BUSY, E_ARG."""
        h = self._h()
        if not _in_range(epoch, _U64_MAX):
            raise LeaseholdError(E_NOT_FOUND, f"no token for epoch {epoch}")
        buf = (ctypes.c_uint8 * TOKEN_BYTES)()
        rc = self._lib.leasehold_token(h, epoch, buf, TOKEN_BYTES)
        if rc < 0:
            raise _fail(rc, None, f"leasehold_token(epoch {epoch})")
        return bytes(buf[:rc])


class Verifier(_Handle):
    """A resource's token verifier: lockd's public key(s) alone. A context manager."""

    _free = "leasehold_verifier_free"
    _what = "verifier"

    def __init__(self) -> None:
        super().__init__(_library().leasehold_verifier_new())
        if not self._handle:
            raise MemoryError("leasehold_verifier_new")

    def add_key_file(self, path: Union[str, os.PathLike]) -> None:
        """Adds a public key file (PEM as lockd writes STORE.signing.key.pub, 32 raw bytes, or 64
        hex digits). Raises LeaseholdError E_ARG / E_IO."""
        err = ctypes.create_string_buffer(_ERR_BYTES)
        rc = self._lib.leasehold_verifier_add_key_file(self._h(), _text(path, "path"), err, _ERR_BYTES)
        if rc != OK:
            raise _fail(rc, err, f"leasehold_verifier_add_key_file({os.fsdecode(path)})")

    def add_key(self, public_key: bytes) -> None:
        """Adds a raw 32-byte Ed25519 public key. Raises LeaseholdError E_ARG."""
        key = bytes(public_key)
        buf = (ctypes.c_uint8 * max(len(key), 1)).from_buffer_copy(key.ljust(1, b"\0"))
        rc = self._lib.leasehold_verifier_add_key(self._h(), buf, len(key))
        if rc != OK:
            raise _fail(rc, None, f"leasehold_verifier_add_key({len(key)} bytes)")

    def verify(self, token: bytes, name: str, epoch: int, holder_uuid: Union[str, uuid.UUID]) -> None:
        """Returns when lockd signed exactly the grant (name, epoch, holder); else raises
        LeaseholdError with a E_TOKEN_* code naming why (E_ARG: malformed name or holder)."""
        tok = bytes(token)
        buf = (ctypes.c_uint8 * max(len(tok), 1)).from_buffer_copy(tok.ljust(1, b"\0"))
        if not _in_range(epoch, _U64_MAX):
            raise LeaseholdError(E_ARG, f"leasehold_verify: epoch {epoch} outside [0, 2**64)")
        err = ctypes.create_string_buffer(_ERR_BYTES)
        rc = self._lib.leasehold_verify(self._h(), buf, len(tok), _text(name, "name"), epoch,
                                        _uuid_text(holder_uuid), err, _ERR_BYTES)
        if rc != OK:
            raise _fail(rc, err, "leasehold_verify")
