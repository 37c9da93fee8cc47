"""Credentials for deploy/compose.yaml: ``python deploy/make_secrets.py [--nodes node-0,node-1]``.

Writes into ``deploy/secrets/`` (git-ignored) what the compose file mounts as secrets:

- ``nats.conf``: the NATS server's configuration, JetStream on and one user per service and
  agent with the subjects it may use (shared/bus/natsauth.py, docs/design.md §11);
- ``users.acl``: Redis's ACL, the same users limited to Unicron's keys, the default user off;
- ``<user>.env``: one container's own login, mounted as ``/run/secrets/unicron.env``;
- ``credentials.json``: every password, kept so that a second run (more nodes, say) changes
  nothing that already works.

Every file is 0600 except ``users.acl``: the Redis container reads it as its own user, and it
holds only SHA-256 digests of random 192-bit passwords.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError
from unicron.shared.bus.natsauth import NatsTls, render_server_config
from unicron.shared.contracts.roles import stack_users
from unicron.shared.servers.credentials import load_or_create, write_private
from unicron.shared.store.redisauth import login_url, render_acl

SECRETS = Path(__file__).resolve().parent / "secrets"
NATS_LISTEN = "0.0.0.0:4222"
NATS_STORE = "/data/jetstream"  # the nats service's volume
REDIS_URL = "redis://redis:6379/0"


def write_secrets(out: Path, node_ids: list[str], tls: NatsTls | None = None) -> list[Path]:
    """Write every secret the compose file names into ``out``; returns the files written."""
    users = stack_users(node_ids)
    credentials = load_or_create(out, users)
    nats_conf = render_server_config(credentials.nats_logins(users), NATS_LISTEN, NATS_STORE, tls)
    write_private(out / "nats.conf", nats_conf)
    acl = out / "users.acl"
    write_private(acl, render_acl(credentials.redis_logins(users)))
    acl.chmod(0o644)
    written = [out / "nats.conf", acl]
    for user in users:
        redis_url = login_url(REDIS_URL, user.name, credentials.redis[user.name])
        env = [
            f"UNICRON_NATS_USER={user.name}",
            f"UNICRON_NATS_PASSWORD={credentials.nats[user.name]}",
            f"UNICRON_REDIS_URL={redis_url}",
        ]
        write_private(out / f"{user.name}.env", "\n".join(env) + "\n")
        written.append(out / f"{user.name}.env")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="node-0,node-1", help="the agents' node ids")
    parser.add_argument("--out", type=Path, default=SECRETS, help="where to write them")
    parser.add_argument("--tls-cert", type=Path, help="NATS certificate, in-container path")
    parser.add_argument("--tls-key", type=Path, help="its key, in-container path")
    args = parser.parse_args()
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = NatsTls(cert=args.tls_cert, key=args.tls_key) if args.tls_cert else None
    try:
        written = write_secrets(args.out, args.nodes.split(","), tls)
    except ValidationError as exc:  # a node id that cannot be a subject token
        parser.error(str(exc.errors(include_input=False)[0]["msg"]))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
