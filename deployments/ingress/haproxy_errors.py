"""HAProxy's own error answers in the service's error format: the files ``deployments/ingress/haproxy/``
holds, and the check that they are what ``errors.error_response`` answers.

HAProxy answers by itself when no ingress replica can take a request (none up, all starting or being
replaced, Ray's fallback proxy down too: 503; a replica that closed the connection without answering: 502;
``timeout server``, if one is set: 504). Ray 2.60 points all three at one file it writes itself
(``HAProxyApi._initialize_directories_and_error_files``: ``500 Internal Server Error``, text/plain) and reads
no setting for its content or path. ``haproxy/haproxy`` (Ray runs it in HAProxy's place,
``RAY_SERVE_HAPROXY_BINARY_PATH``) points those ``errorfile`` lines at these files instead.

HAProxy reads the files at every start and reload, which Ray makes often; rendering them then would import Ray
(about a second) each time. They are written here once: ``python -m deployments.ingress.haproxy_errors``.
"""

from __future__ import annotations

import sys
from http import HTTPStatus
from pathlib import Path

from contracts.errors import DeadlineExceededError, ServiceError, UnavailableError
from deployments.ingress.errors import error_response

DIRECTORY = Path(__file__).resolve().parent / "haproxy"
LAUNCHER = DIRECTORY / "haproxy"

# File name -> the error it answers. 502 and 503 share the first: either way no replica answered, and a retry
# reaches the replica that replaces it (or the one Ray's fallback proxy waits for).
ERROR_FILES: dict[str, ServiceError] = {
    "503.http": UnavailableError(
        "no ingress replica could take the request (starting, replaced or gone); retry shortly"
    ),
    "504.http": DeadlineExceededError("the ingress replica did not answer in time"),
}
# HAProxy's status -> the file its errorfile line names (the launcher's mapping, kept in one place for tests).
FILE_OF_STATUS = {502: "503.http", 503: "503.http", 504: "504.http"}


def errorfile(error: ServiceError) -> bytes:
    """The raw HTTP/1.1 response HAProxy sends for ``error``: error_response's status, headers and body."""
    response = error_response(error)
    status = HTTPStatus(response.status_code)
    lines = [f"HTTP/1.1 {status.value} {status.phrase}"]
    lines += [f"{name}: {value}" for name, value in response.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + bytes(response.body)


def stale_files(directory: Path = DIRECTORY) -> list[str]:
    """The error files in ``directory`` that differ from what error_response answers now."""
    return [
        name
        for name, error in ERROR_FILES.items()
        if not (directory / name).is_file() or (directory / name).read_bytes() != errorfile(error)
    ]


def write_files(directory: Path = DIRECTORY) -> None:
    for name, error in ERROR_FILES.items():
        (directory / name).write_bytes(errorfile(error))


def main(argv: list[str]) -> int:
    """Writes the files; ``--check``: exit 1 if one is out of date."""
    if argv[1:] == ["--check"]:
        stale = stale_files()
        for name in stale:
            print(f"{DIRECTORY / name} is out of date: python -m deployments.ingress.haproxy_errors")
        return 1 if stale else 0
    write_files()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
