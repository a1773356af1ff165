#!/usr/bin/env bash
# Checks the systemd unit of deploy/systemd (docs/deploy.md#systemd), on a machine where
# systemd need not be running, and prints the figures:
#
#  1. `systemd-analyze verify` prints nothing for the unit (it exits 0 on unknown keys, so
#     its output is what counts); ExecStart points at a link in a temporary directory,
#     since /usr/local/bin/agentry is not installed here;
#  2. `systemd-analyze security --offline=yes`: the overall exposure, at most 4.5;
#  3. agentry.sysusers creates the user `agentry` (into a temporary root);
#  4. the agents' sandbox still works under the unit's restrictions. systemd is not PID 1
#     here, so the unit itself is not started; instead
#     a. bubblewrap runs the runner's own trial sandbox (crates/runner/src/sandbox.rs,
#        `probe`) under strace, as a user without capabilities and with no_new_privs, and
#        every system call, socket family and namespace it uses must be allowed by the
#        unit's SystemCallFilter=, RestrictAddressFamilies= and RestrictNamespaces=;
#     b. the same trial runs in a mount namespace set up as the unit's settings set up the
#        service's (ProtectSystem=strict: a read-only root moved over /, ProtectHome=,
#        PrivateTmp=, PrivateDevices=, PrivateIPC=, ProtectProc=invisible,
#        ProtectHostname=), as a non-root user with no_new_privs and no capabilities
#        (NoNewPrivileges=, CapabilityBoundingSet=); and it must fail once /proc/sys is
#        read-only, which is what ProtectKernelTunables= would do (the reason the unit
#        leaves it out), so the check can fail.
#
# Needs root (for 3 and 4); installs what it lacks from Debian's archive (systemd,
# bubblewrap, strace). Exits non-zero on any failure. Usage: scripts/check-unit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
unit=deploy/systemd/agentry.service
sysusers=deploy/systemd/agentry.sysusers
max_exposure=4.5
start=$(date +%s.%N)
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

[ "$(id -u)" = 0 ] || fail "run as root: the sandbox checks switch users and mount"
missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v strace >/dev/null || missing+=(strace)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
systemd-analyze --version | head -1
bwrap --version

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step "systemd-analyze verify $unit"
# The same unit, with ExecStart at a link to an existing program: a link to the agentry
# binary when one is built, else to `true` (verify checks only that it can be executed).
target=${AGENTRY_BIN:-target/release/agentry}
[ -x "$target" ] || target=/usr/bin/true
ln -s "$(realpath "$target")" "$tmp/agentry"
grep -q '^ExecStart=/usr/local/bin/agentry serve$' "$unit" ||
    fail "$unit: ExecStart is not /usr/local/bin/agentry serve"
sed "s|^ExecStart=/usr/local/bin/agentry |ExecStart=$tmp/agentry |" "$unit" >"$tmp/agentry.service"
if ! verify=$(systemd-analyze verify "$tmp/agentry.service" 2>&1) || [ -n "$verify" ]; then
    echo "${verify//$tmp\//(temporary directory)/}" >&2
    fail "systemd-analyze verify printed the above"
fi
echo "no output (ExecStart linked to $target)"

step "systemd-analyze security --offline=yes $unit"
security=$(systemd-analyze security --offline=yes "$unit" 2>&1) || true
echo "$security" | grep -E '^✗' || true
overall=$(echo "$security" | grep 'Overall exposure level' || true)
echo "$overall"
exposure=$(echo "$overall" | sed -nE 's/.*: ([0-9]+(\.[0-9]+)?) .*/\1/p')
[ -n "$exposure" ] || fail "no exposure level in systemd-analyze security's output"
awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e <= m) }' ||
    fail "exposure $exposure is above $max_exposure"

step "systemd-sysusers $sysusers"
mkdir -p "$tmp/root/etc/sysusers.d"
cp "$sysusers" "$tmp/root/etc/sysusers.d/agentry.conf"
systemd-sysusers --root="$tmp/root"
entry=$(grep '^agentry:' "$tmp/root/etc/passwd") || fail "no user agentry"
echo "$entry"
case "$entry" in
*:/var/lib/agentry:/usr/sbin/nologin) ;;
*) fail "agentry's home is not /var/lib/agentry or its shell not nologin" ;;
esac
grep -q '^agentry:' "$tmp/root/etc/group" || fail "no group agentry"

# The runner's trial sandbox (sandbox.rs: PROBE_ROOT_ARGS, BASE_ARGS, the features of
# bubblewrap 0.8 and the network namespace): what every agent's sandbox is built with.
probe=(bwrap --ro-bind / / --dev /dev --proc /proc --unshare-pid --unshare-ipc --unshare-uts
    --unshare-cgroup-try --die-with-parent --new-session --cap-drop ALL
    --unshare-user --disable-userns --unshare-net --size 1048576 --tmpfs /tmp -- true)
# A user without capabilities, with no_new_privs, as the unit starts agentry.
as_service=(setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs
    --bounding-set=-all --inh-caps=-all --)

step "the sandbox's system calls, socket families and namespaces against the unit's lists"
# One value of a setting, joined over its lines (the unit sets each once).
setting() { sed -nE "s/^$1=(.*)/\1/p" "$unit" | tr '\n' ' '; }
filter=$(setting SystemCallFilter)
case "$filter" in "" | "~"*) fail "SystemCallFilter= is not an allow list" ;; esac
# The allow list with its groups expanded (`systemd-analyze syscall-filter` lists a group's
# calls and nested groups).
declare -A allowed=() seen_groups=()
expand() {
    local item
    for item in "$@"; do
        if [[ $item == @* ]]; then
            [ -n "${seen_groups[$item]:-}" ] && continue
            seen_groups[$item]=1
            # shellcheck disable=SC2046
            expand $(systemd-analyze syscall-filter "$item" 2>/dev/null |
                sed -nE 's/^ +([@a-z0-9_-]+)$/\1/p')
        else
            allowed[$item]=1
        fi
    done
}
# shellcheck disable=SC2086
expand @default $filter
strace -f -qq -o "$tmp/strace" "${as_service[@]}" "${probe[@]}" ||
    fail "the trial sandbox failed under strace: $(tail -3 "$tmp/strace")"
calls=$(sed -nE 's/^[0-9]+ +([a-z0-9_]+)\(.*/\1/p' "$tmp/strace" | sort -u)
refused=()
for call in $calls; do [ -n "${allowed[$call]:-}" ] || refused+=("$call"); done
[ ${#refused[@]} -eq 0 ] || fail "bubblewrap calls what SystemCallFilter= refuses: ${refused[*]}"
echo "system calls: $(echo "$calls" | wc -l), all allowed (mount, pivot_root, umount2: $(
    echo "$calls" | grep -cxE 'mount|pivot_root|umount2') of 3 used)"
families=$(grep -oE '(socket|socketpair)\(AF_[A-Z0-9]+' "$tmp/strace" | sed 's/.*(//' | sort -u)
restrict_af=" $(setting RestrictAddressFamilies) "
for family in $families; do
    [[ $restrict_af == *" $family "* ]] || fail "RestrictAddressFamilies= refuses $family"
done
echo "socket families, all allowed: $(tr '\n' ' ' <<<"$families")"
namespaces=$(grep -E '^[0-9]+ +(clone3?|unshare|setns)\(' "$tmp/strace" |
    grep -oE 'CLONE_NEW[A-Z]+' | sort -u | sed -e 's/CLONE_NEWNS/mnt/' -e 's/CLONE_NEW//' |
    tr '[:upper:]' '[:lower:]')
restrict_ns=" $(setting RestrictNamespaces) "
for ns in $namespaces; do
    [[ $restrict_ns == *" $ns "* ]] || fail "RestrictNamespaces= refuses the $ns namespace"
done
echo "namespaces, all allowed: $(tr '\n' ' ' <<<"$namespaces")"

step "the sandbox inside the unit's mount namespace, as an unprivileged user"
# Each of the unit's settings below is checked to be there, then set up as systemd sets it
# up: the host's root bound recursively to a new directory, made read-only, moved over / and
# entered with chroot (ProtectSystem=strict; a bind mount left under the old root would
# look like a chroot to the kernel, which then refuses user namespaces).
for want in ProtectSystem=strict ProtectHome=yes PrivateTmp=yes PrivateDevices=yes \
    PrivateIPC=yes ProtectProc=invisible ProtectHostname=yes NoNewPrivileges=yes \
    CapabilityBoundingSet=; do
    grep -qxF "$want" "$unit" || fail "$unit no longer has $want: update this check"
done
for absent in ProtectKernelTunables ProtectKernelLogs ProcSubset PrivateUsers; do
    ! grep -qE "^$absent=" "$unit" || fail "$unit sets $absent=, which the sandbox cannot run under"
done
mkdir -p "$tmp/newroot"
unit_mounts() {
    cat <<EOF
set -e
mount --make-rprivate /
mount --rbind / "$tmp/newroot"
cd "$tmp/newroot"
mount -o remount,bind,ro .
for d in home root run/user; do [ -d "\$d" ] && mount -t tmpfs -o mode=000,ro tmpfs "\$d"; done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs var/tmp
mount -t tmpfs -o mode=755,nosuid,noexec tmpfs dev
for n in null zero full random urandom tty; do touch "dev/\$n"; mount --bind "/dev/\$n" "dev/\$n"; done
mkdir dev/pts dev/shm; ln -s pts/ptmx dev/ptmx
mount -t devpts -o newinstance,ptmxmode=0666 devpts dev/pts
mount -t proc -o hidepid=invisible,nosuid,nodev,noexec proc proc
$1
mount --move . /
EOF
}
run_in_unit() {
    unshare --mount --uts --ipc --propagation private bash -c "$(unit_mounts "$1")
        exec chroot . \"\$@\"" bash "${as_service[@]}" "${probe[@]}"
}
if ! out=$(run_in_unit "" 2>&1); then
    fail "the trial sandbox fails in the unit's mount namespace: $out"
fi
echo "the runner's trial sandbox works (user, mount, PID, network, IPC, UTS namespaces)"
if out=$(run_in_unit "mount --bind proc/sys proc/sys; mount -o remount,bind,ro proc/sys" 2>&1); then
    fail "the trial sandbox also works with /proc/sys read-only: this check cannot fail"
fi
echo "with /proc/sys read-only (ProtectKernelTunables=yes) it fails, as expected: $out"

step "ok ($(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s)"
echo "figure: unit exposure $exposure (systemd-analyze security --offline=yes, at most $max_exposure)"
