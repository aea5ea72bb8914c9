#!/usr/bin/env bash
# Install the servers the test suite starts itself (PostgreSQL, Redis, the HAProxy load balancer of
# the local scale-out topology) and the sandbox it runs untrusted code in (bubblewrap) when they are missing.
# The tests start and stop their own instances on loopback; this only makes the binaries present.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1 || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing test servers: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Debian starts the packaged services; the tests run their own instances.
    (service postgresql stop || true; service redis-server stop || true; service haproxy stop || true) >/dev/null 2>&1
  else
    echo "WARNING: ${need[*]} missing and cannot be installed here (need root + apt-get)." >&2
  fi
fi
