"""A path a run reads (local or gs://) that its storage cannot serve, as one UserError line.

gs:// is read through etils.epath: gcsfs in the trainer image, TensorFlow's file system where TensorFlow
is installed (the development environment). Without credentials or network their failures are of no
one type (gcsfs's HttpError, aiohttp's connection errors, google.auth's, OSError "Forbidden",
TensorFlow's OpErrors), and Orbax may wrap them; gcsfs also logs each failed request with its
traceback. `reading` turns any of them into the line that names the path and the fix, and keeps
gcsfs's log quiet meanwhile: the line says it all.
"""

from __future__ import annotations

import contextlib
import logging

from trainer.errors import UserError

# The modules whose exceptions are storage failures, beside OSError (connection refused, timeouts, permissions).
_STORAGE_MODULES = ("aiohttp", "gcsfs", "fsspec", "google.auth", "google.api_core", "google.cloud", "requests",
                    "urllib3", "tensorflow")
CLOUD_FIX = ("check the network and the Google Cloud credentials (`gcloud auth application-default login`; on GKE, "
             "a Workload Identity binding of the pod's service account)")


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


def storage_failure(error: BaseException) -> BaseException | None:
    """The exception in `error`'s chain (itself, its causes) that the storage raised, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        module = type(error).__module__
        if isinstance(error, OSError) or any(module == name or module.startswith(name + ".") for name in _STORAGE_MODULES):
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def reading(what: str, path, *, instead: str):
    """Runs the block that reads `path`; a storage failure in it becomes the UserError
    "{what} {path}: cannot read it (reason); <the fix>, or {instead}". A UserError, and any exception
    that is no storage failure (a bug), passes as it is."""
    gcsfs_log = logging.getLogger("gcsfs")
    was_disabled, gcsfs_log.disabled = gcsfs_log.disabled, True
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        failure = storage_failure(error)
        if failure is None:
            raise
        fix = CLOUD_FIX if "://" in str(path) else "check that this job may read it"
        raise UserError(f"{what} {path}: cannot read it ({first_line(failure)}); {fix}, or {instead}") from None
    finally:
        gcsfs_log.disabled = was_disabled
