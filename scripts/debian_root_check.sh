#!/usr/bin/env bash
# Proves the README's "fresh Debian 12" claim: a clean Debian 12 root (debootstrap, minbase), this commit's
# files copied in, `scripts/setup.sh` run there as a new user would, then one task of each app kind of the
# embedded gym started and scored there (mousepad, xterm, pcmanfm, the Tk board, Chromium with MiniWoB++):
# each task's scripted solution scores 1 and the untouched task below 1 (the gym's own tests, run inside).
#
#   sudo bash scripts/debian_root_check.sh [DIR]      # DIR defaults to /var/tmp/cua-rl-debian12 (removed first)
#
# Not part of CI: it downloads a Debian base system and every Debian package of the stack (about 1 GB) and
# takes 15-40 minutes. Root is needed (debootstrap, mounts). Two caches are bind-mounted to spare downloads
# on a rerun, and nothing else of the host reaches the root: the .deb archive (/var/cache/cua-rl-debian12/apt,
# debootstrap's own --cache-dir beside it) and uv's wheel cache ($CUA_RL_HOME/uv-cache, default
# ~/.cache/cua-rl/uv-cache; the wheels there are the lock file's pins, which setup.sh installs by version, so a
# cached wheel is the same file as a downloaded one). CUA_RL_DEBIAN_NO_UV_CACHE=1 downloads the wheels too.
#
# The root is entered through pivot_root in a private mount namespace, not chroot: the kernel refuses user
# namespaces (bubblewrap, Chromium's sandbox) to a chrooted process, which a real machine does not.
# The summary goes to stdout and, as JSON, to DIR.json.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-/var/tmp/cua-rl-debian12}"
CACHE=/var/cache/cua-rl-debian12
MIRROR="${CUA_RL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_UV_CACHE="${CUA_RL_HOME:-$HOME/.cache/cua-rl}/uv-cache"
log() { printf '[debian-root] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (debootstrap and the mounts need it)"; exit 2; }
t_start=$SECONDS

command -v debootstrap >/dev/null || { log "installing debootstrap on this host"; apt-get install -y -qq debootstrap >/dev/null; }
mkdir -p "$CACHE/apt" "$CACHE/debootstrap"

cleanup() {
  for m in root/.cache/cua-rl/uv-cache var/cache/apt/archives dev/pts dev/shm dev sys proc; do
    mountpoint -q "$TARGET/$m" 2>/dev/null && umount -l "$TARGET/$m" || true
  done
}
trap cleanup EXIT
cleanup
rm -rf "$TARGET"

log "debootstrap --variant=minbase bookworm $TARGET ($MIRROR)"
t0=$SECONDS
debootstrap --variant=minbase --cache-dir="$CACHE/debootstrap" bookworm "$TARGET" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
  || { tail -n 30 "$CACHE/debootstrap.log" >&2; exit 1; }
t_debootstrap=$((SECONDS - t0))
log "  done in ${t_debootstrap} s; $(chroot "$TARGET" dpkg-query -W | wc -l) packages in the base system"

# This commit's tracked files, as a clone would have them (uncommitted changes included: a check of the tree).
mkdir -p "$TARGET/root/cua-rl"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$TARGET/root/cua-rl"
cp /etc/resolv.conf "$TARGET/etc/resolv.conf"
# A host behind a TLS-intercepting egress proxy (like the developers' machines) trusts the proxy's CA through
# /usr/local/share/ca-certificates and SSL_CERT_FILE/PIP_CERT: both are passed on, since without them PyPI is
# unreachable from the new root. A machine with a direct connection has neither, and nothing is copied.
mkdir -p "$TARGET/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$TARGET/usr/local/share/ca-certificates/" 2>/dev/null || true
pass_env=()
for v in SSL_CERT_FILE PIP_CERT REQUESTS_CA_BUNDLE HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  [ -n "${!v:-}" ] && pass_env+=("$v=${!v}")
done
mount -t proc proc "$TARGET/proc"
mount --rbind /sys "$TARGET/sys" && mount --make-rslave "$TARGET/sys"
mount --rbind /dev "$TARGET/dev" && mount --make-rslave "$TARGET/dev"
mount --bind "$CACHE/apt" "$TARGET/var/cache/apt/archives"
if [ "${CUA_RL_DEBIAN_NO_UV_CACHE:-0}" != 1 ] && [ -d "$HOST_UV_CACHE" ]; then
  mkdir -p "$TARGET/root/.cache/cua-rl/uv-cache"
  mount --bind "$HOST_UV_CACHE" "$TARGET/root/.cache/cua-rl/uv-cache"
  uv_cache="bind-mounted from the host"
else
  uv_cache="empty (wheels downloaded)"
fi

# Runs "$@" inside the root: a private mount namespace whose root is the new system (pivot_root).
inside() {
  unshare --mount --propagation private -- /bin/sh -c '
    set -e; T="$1"; shift
    mount --rbind "$T" "$T"; cd "$T"; mkdir -p .oldroot
    pivot_root . .oldroot; cd /; umount -l /.oldroot; rmdir /.oldroot 2>/dev/null || true
    exec env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
  ' _ "$TARGET" "${pass_env[@]}" "$@"
}

log "scripts/setup.sh inside the new root (as the README says: the embedded stack's packages, the Python environment)"
t0=$SECONDS
set +e
inside /bin/bash -c 'cd /root/cua-rl && CUA_RL_DEVICE=cpu bash scripts/setup.sh' 2>&1 | sed 's/^/  | /' >&2
setup_rc=${PIPESTATUS[0]}
set -e
t_setup=$((SECONDS - t0))
log "  setup.sh exited $setup_rc after ${t_setup} s"

# One task of each app kind, through the gym's own tests (each: scripted solution 1.0, untouched below 1):
# 001 mousepad, 012 xterm, 023 pcmanfm (test_task_solutions), the curriculum's Tk board families
# (test_curriculum), MiniWoB++ in Chromium (test_miniwob's scripted solutions).
tests_rc=1
if [ "$setup_rc" = 0 ]; then
  log "one task of each app kind, inside the new root"
  t0=$SECONDS
  set +e
  inside /bin/bash -c 'cd /root/cua-rl && source scripts/env.sh >/dev/null && CUA_GYM_TEST_TASKS=001,012,023 \
    python -m pytest -q -p no:cacheprovider \
      tests/local_gym/test_task_solutions.py \
      "tests/local_gym/test_curriculum.py::test_scripted_solutions_score_one_and_untouched_or_wrong_do_not" \
      "tests/local_gym/test_miniwob.py::test_scripted_solutions_reach_reward_one_and_untouched_executions_do_not"' \
    2>&1 | sed 's/^/  | /' | tee "$CACHE/tests.log" >&2
  tests_rc=${PIPESTATUS[0]}
  set -e
  t_tests=$((SECONDS - t0))
fi
passed="$(grep -Eo '[0-9]+ passed' "$CACHE/tests.log" 2>/dev/null | tail -1 || true)"
debs="$(inside dpkg-query -W | wc -l)"
summary=$(cat <<EOF
{"debian": "$(cat "$TARGET/etc/debian_version")", "variant": "minbase", "commit": "$(cd "$REPO" && git rev-parse --short HEAD)",
 "debootstrap_s": $t_debootstrap, "setup_s": $t_setup, "setup_exit": $setup_rc, "tests_s": ${t_tests:-0},
 "tests_exit": $tests_rc, "tests": "${passed:-none}", "packages_installed": $debs,
 "apt_cache": "$CACHE/apt bind-mounted", "uv_cache": "$uv_cache", "total_s": $((SECONDS - t_start))}
EOF
)
echo "$summary" | tee "$TARGET.json"
[ "$setup_rc" = 0 ] && [ "$tests_rc" = 0 ]
