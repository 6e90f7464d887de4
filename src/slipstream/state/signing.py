"""The key that signs snapshot files (HMAC-SHA256), and where it comes from.

Snapshots hold pickled processor state, and unpickling runs code: a file that someone
else could have written must never be unpickled. Every snapshot file (and the manifest)
therefore carries an HMAC of its content, checked *before* anything is unpickled.

The key, in order of precedence:

1. ``JobConfig(snapshot_key=...)`` (``bytes`` or ``str``, at least 16 bytes);
2. the environment variable ``SLIPSTREAM_SNAPSHOT_KEY``;
3. a random key per store directory, created on first use in a private key directory
   (``$SLIPSTREAM_KEY_DIR``, else ``$XDG_STATE_HOME/slipstream/snapshot-keys``, else
   ``~/.local/state/slipstream/snapshot-keys``). Its file name is derived from the store's
   absolute path, so a new process finds it from the store's location alone. The key
   lives *outside* the store, so write access to the store is not enough to forge a
   snapshot. The directory must be ``0700`` and the file ``0600``, both owned by the
   current user; anything else is refused with an error saying how to fix it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time

from slipstream.core.errors import SnapshotError
from slipstream.core.files import UnsafeDirectoryError, private_dir

KEY_ENV = "SLIPSTREAM_SNAPSHOT_KEY"
KEY_DIR_ENV = "SLIPSTREAM_KEY_DIR"
MIN_KEY_BYTES = 16


def key_dir() -> str:
    """The private directory holding the default per-store keys."""
    explicit = os.environ.get(KEY_DIR_ENV)
    if explicit:
        return os.path.abspath(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "slipstream", "snapshot-keys")


def store_file_path(store_dir: str, suffix: str) -> str:
    """A file about the store in ``store_dir`` kept in the private key directory, named
    after the store's real path (``<digest><suffix>``): its key, its generation."""
    real = os.path.realpath(os.path.abspath(store_dir))
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(key_dir(), f"{digest}{suffix}")


def store_key_path(store_dir: str) -> str:
    """Where the default key of the store in ``store_dir`` lives."""
    return store_file_path(store_dir, ".key")


def _as_key(value: bytes | str, origin: str) -> bytes:
    key = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(key) < MIN_KEY_BYTES:
        raise SnapshotError(f"{origin} must be at least {MIN_KEY_BYTES} bytes long")
    return key


def _check_private(path: str, st: os.stat_result, what: str, mode: int) -> None:
    uid = os.getuid()
    if st.st_uid != uid:
        raise SnapshotError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}); "
            "refusing to use it for snapshot signing"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise SnapshotError(
            f"{what} {path} is accessible by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}); run: chmod {mode:o} {path}"
        )


def ensure_key_dir() -> str:
    """Create the private key directory (``0700``) or check the existing one: a
    :class:`SnapshotError` if it is not private, ``OSError`` if it cannot be created."""
    path = key_dir()
    _private_dir(path)
    return path


def _private_dir(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        private_dir(path)
    except UnsafeDirectoryError as e:
        raise SnapshotError(
            f"snapshot key directory is not private: {e}; run: chmod 700 {path} "
            f"(or set {KEY_DIR_ENV})"
        ) from e


def default_store_key(store_dir: str) -> bytes:
    """The store's random key, created (``0600``) if it does not exist yet."""
    path = store_key_path(store_dir)
    try:
        _private_dir(os.path.dirname(path))
    except OSError as e:
        raise SnapshotError(
            f"cannot create the snapshot key directory {os.path.dirname(path)}: {e}; set "
            f"{KEY_DIR_ENV}, {KEY_ENV} or JobConfig(snapshot_key=...)"
        ) from e
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
    for _ in range(100):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "r", encoding="ascii") as fh:
            _check_private(path, os.fstat(fh.fileno()), "snapshot key file", 0o600)
            text = fh.read().strip()
        if len(text) >= 2 * MIN_KEY_BYTES:
            return text.encode("ascii")
        time.sleep(0.01)  # another process has created it and is writing it
    raise SnapshotError(f"snapshot key file {path} is empty or truncated")


def resolve_key(store_dir: str, explicit: bytes | str | None) -> tuple[bytes, str]:
    """The signing key for the store in ``store_dir`` and a description of its origin
    (for error messages)."""
    if explicit is not None:
        return _as_key(explicit, "JobConfig.snapshot_key"), "JobConfig.snapshot_key"
    env = os.environ.get(KEY_ENV)
    if env:
        return _as_key(env, KEY_ENV), f"${KEY_ENV}"
    return default_store_key(store_dir), f"key file {store_key_path(store_dir)}"


#: ``sign`` hashes small parts joined into pieces of about this size: ``update`` lets
#: the GIL go for a buffer over 2 KB, and taking it back waits up to the switch interval
#: (5 ms) while a processing thread runs Python, so a copy-on-write save of 10M keys
#: (~450 encoded fragments of ~120 KB) took seconds to sign and write on the store
#: thread (docs/performance.md, "The store thread's GIL hand-offs")
SIGN_GROUP_BYTES = 4 << 20


def sign(key: bytes, *parts: bytes | memoryview) -> str:
    """The hex HMAC-SHA256 of the parts' concatenation (hashed in pieces of about
    :data:`SIGN_GROUP_BYTES`: one copy of each small part, a few GIL hand-offs)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    group: list[bytes | memoryview] = []
    size = 0
    for p in parts:
        group.append(p)
        size += len(p)
        if size >= SIGN_GROUP_BYTES:
            mac.update(group[0] if len(group) == 1 else b"".join(group))
            group = []
            size = 0
    if group:
        mac.update(group[0] if len(group) == 1 else b"".join(group))
    return mac.hexdigest()


def verify(key: bytes, mac: str, *parts: bytes | memoryview) -> bool:
    return hmac.compare_digest(sign(key, *parts), mac)
