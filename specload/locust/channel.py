"""Who may take tickets and return records on the master channel: the processes that know the run's
master token.

Locust's ZeroMQ channel takes messages from anyone who reaches the master port, under any worker id
they claim, and a process that joins is given users like any worker. The master therefore grants a
ticket only to a worker that joined and proves it knows the token, and takes a record (or a return)
only with a proof bound to that worker and that ticket's secret. The token itself never travels:
each message carries an HMAC of (worker id, the master's nonce for this join, what it is for) keyed
with it. The nonce is fresh for each join (specload.locust.joingate), so a proof read off the wire
in one run, or one join, is worth nothing in the next. ``specload sweep
--processes N`` makes a token for each run and hands it to its own processes in their environment;
a master with remote workers (``--workers N``) and each ``specload worker`` read the one the
operator gave them all in ``SPECLOAD_MASTER_TOKEN``.

This authenticates, it does not encrypt: someone who can read the traffic sees the records and the
prompts (docs/deploy.md: keep the master port on a private network).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

MASTER_TOKEN_ENV = "SPECLOAD_MASTER_TOKEN"
MIN_TOKEN_CHARS = 16  # a guessable token protects nothing
FOR_TICKETS = "tickets"  # what a ticket request's proof is for (a record's is its ticket's secret)
FOR_JOIN = "join"  # what a worker's join proof is for (specload.locust.joingate)


def master_token() -> str | None:
    """The token in this process's environment, if any (checked for length by ``token_problem``)."""
    return os.environ.get(MASTER_TOKEN_ENV) or None


def token_problem(token: str | None) -> str | None:
    """Why ``token`` cannot protect the master channel, or None when it can."""
    if token is None:
        return (
            f"the master channel needs a shared token: set {MASTER_TOKEN_ENV} to the same secret "
            "on the master and on every worker (e.g. `openssl rand -hex 32`; docs/deploy.md)"
        )
    if len(token) < MIN_TOKEN_CHARS:
        return f"{MASTER_TOKEN_ENV} is too short: use at least {MIN_TOKEN_CHARS} characters"
    return None


def new_master_token() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    """A master's challenge for one join: every proof of that worker's is bound to it."""
    return secrets.token_hex(16)


def proof(token: str, node: str, what: str, nonce: str = "") -> str:
    """The proof that the sender of a message about ``what`` from worker ``node``, in the join the
    master gave ``nonce`` to, knows the token."""
    return hmac.new(token.encode(), f"{node}\0{nonce}\0{what}".encode(), hashlib.sha256).hexdigest()[:32]


def proven(token: str | None, node: str, what: str, given: str, nonce: str = "") -> bool:
    return token is not None and hmac.compare_digest(proof(token, node, what, nonce), given)
