#!/usr/bin/env bash
# Checks the systemd unit of deploy/systemd (docs/deploy.md#systemd) and prints its figures,
# on a machine where systemd is not PID 1 (CI's):
#
#  1. `systemd-analyze verify` prints nothing for the unit (it exits 0 on unknown keys, so
#     its output is what counts); ExecStart points at a link to the binary in a temporary
#     directory, since /usr/local/bin/agentry is not installed here;
#  2. `systemd-analyze security --offline=yes`: the overall exposure, at most 4.5;
#  3. agentry.sysusers creates the user `agentry` (into a temporary root);
#  4. bubblewrap runs the runner's own trial sandbox (crates/runner/src/sandbox.rs, `probe`)
#     under strace, as a user without capabilities and with no_new_privs, and every system
#     call, socket family and namespace it uses must be allowed by the unit's
#     SystemCallFilter=, RestrictAddressFamilies= and RestrictNamespaces=;
#  5. the unit itself under systemd: the host's systemd boots in a container
#     (systemd-nspawn) and starts the unit as it is; agentry serves /readyz as the user
#     agentry, writes its database in /var/lib/agentry, stops cleanly on SIGTERM, and
#     `agentry doctor` under the same unit finds that bubblewrap works with every feature,
#     while under the unit with ProtectKernelTunables=yes added it does not (so the check
#     can fail).
#
# Needs root, and the agentry binary: AGENTRY_BIN, else target/release/agentry (or under
# CARGO_TARGET_DIR), else the debug build. Installs what it lacks from Debian's archive
# (systemd, systemd-container, bubblewrap, strace, curl). Exits non-zero on any failure.
# Usage: [AGENTRY_BIN=PATH] scripts/check-unit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
unit=deploy/systemd/agentry.service
sysusers=deploy/systemd/agentry.sysusers
max_exposure=4.5
start=$(date +%s.%N)
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

[ "$(id -u)" = 0 ] || fail "run as root: the checks switch users, mount and boot a container"
bin=${AGENTRY_BIN:-}
if [ -z "$bin" ]; then
    for candidate in target/release/agentry "${CARGO_TARGET_DIR:-target}/release/agentry" \
        target/debug/agentry "${CARGO_TARGET_DIR:-target}/debug/agentry"; do
        [ -x "$candidate" ] && bin=$candidate && break
    done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    fail "no agentry binary: build one (cargo build --release) or set AGENTRY_BIN"
fi
missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v strace >/dev/null || missing+=(strace)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
systemd-analyze --version | head -1
bwrap --version
"$bin" --version

tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT

step "systemd-analyze verify $unit"
# The same unit, with ExecStart at a link to the binary.
ln -s "$(realpath "$bin")" "$tmp/agentry"
grep -q '^ExecStart=/usr/local/bin/agentry serve$' "$unit" ||
    fail "$unit: ExecStart is not /usr/local/bin/agentry serve"
sed "s|^ExecStart=/usr/local/bin/agentry |ExecStart=$tmp/agentry |" "$unit" >"$tmp/agentry.service"
if ! verify=$(systemd-analyze verify "$tmp/agentry.service" 2>&1) || [ -n "$verify" ]; then
    echo "${verify//$tmp\//(temporary directory)/}" >&2
    fail "systemd-analyze verify printed the above"
fi
echo "no output (ExecStart linked to $bin)"

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

step "the unit under systemd as PID 1 (systemd-nspawn), with $bin"
# The host's own systemd boots in a container whose /usr is the host's (with the agentry
# binary added at /usr/local/bin) and whose /etc holds only the unit, the sysusers file and
# the units of this check: agentry-doctor.service, the unit itself running `agentry doctor`
# (whose sandbox check is the runner's probe of bubblewrap, logged with the features that
# work); two variants of it with a setting added that the unit leaves out, which must show
# (so this check can fail): SystemCallFilter=~@mount, under which bubblewrap fails, and
# ProtectKernelTunables=yes, under which it loses --disable-userns; and agentry-check.service,
# the unit booted into, which waits for agentry.service's /readyz, records what it finds in
# /out, stops agentry and exits the container.
#
# The container shares the host's kernel settings: bubblewrap needs a /proc/sys it can write
# (above), so the container's is left writable (SYSTEMD_NSPAWN_API_VFS_WRITABLE; nspawn
# refuses that with a user namespace of its own). So that nothing of the host changes, the
# container has its own network, the units that write kernel settings or drive devices
# (sysctl, udev, binfmt, modules) are masked, and its cgroups are removed afterwards. Its
# systemd raises fs.file-max to the most the kernel takes when it is lower, as it does on
# every systemd host.
r=$tmp/container
mkdir -p "$r"/{usr,etc/systemd/system,etc/sysusers.d,var,tmp,run,proc,sys,dev,root,home} \
    "$tmp/usr-agentry/local/bin" "$tmp/out"
for l in bin sbin lib lib64; do [ -e "/$l" ] && ln -s "usr/$l" "$r/$l"; done
ln -s ../usr/lib/os-release "$r/etc/os-release"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\n' >"$r/etc/group"
cp /etc/nsswitch.conf "$r/etc/"
: >"$r/etc/machine-id"
cp "$sysusers" "$r/etc/sysusers.d/agentry.conf"
units=$r/etc/systemd/system
cp "$unit" "$units/"
touch "$tmp/usr-agentry/local/bin/agentry" # the mount point of the binary
for masked in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
    systemd-udev-trigger.service systemd-udev-settle.service systemd-sysctl.service \
    systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-modules-load.service \
    kmod-static-nodes.service systemd-random-seed.service sys-kernel-config.mount \
    sys-kernel-debug.mount sys-kernel-tracing.mount sys-fs-fuse-connections.mount \
    dev-hugepages.mount; do
    ln -s /dev/null "$units/$masked"
done
doctor_unit() {
    sed -e 's|^ExecStart=/usr/local/bin/agentry serve$|ExecStart=/usr/local/bin/agentry doctor\nEnvironment=RUST_LOG=info|' \
        -e 's|^Type=exec$|Type=oneshot|' -e '/^Restart/d' "$unit"
}
doctor_unit >"$units/agentry-doctor.service"
# A variant: the setting added at the end of [Service], where it overrides the unit's own.
doctor_unit | sed '/^\[Install\]/i SystemCallFilter=~@mount' >"$units/agentry-doctor-mount.service"
doctor_unit | sed '/^\[Install\]/i ProtectKernelTunables=yes' >"$units/agentry-doctor-tunables.service"
cat >"$units/agentry-check.service" <<'UNIT'
[Unit]
Wants=agentry.service agentry-doctor.service agentry-doctor-mount.service agentry-doctor-tunables.service
After=agentry.service agentry-doctor.service agentry-doctor-mount.service agentry-doctor-tunables.service
SuccessAction=exit
FailureAction=exit
[Service]
Type=oneshot
ExecStart=/bin/sh -c '\
  for i in $(seq 150); do curl -fsS http://127.0.0.1:8080/readyz >/out/readyz 2>&1 && break; sleep 0.2; done; \
  pid=$(systemctl show -p MainPID --value agentry.service); \
  stat -c "%%U" /proc/$pid >/out/user; \
  stat -c "%%n %%U %%a" /var/lib/agentry /var/lib/agentry/agentry.db >/out/data; \
  systemctl stop agentry.service; \
  systemctl show -p Result -p ExecMainStatus agentry.service >/out/stopped; \
  for u in agentry agentry-doctor agentry-doctor-mount agentry-doctor-tunables; do journalctl -o cat -u $u.service >/out/$u.log; done'
UNIT
# nspawn makes `payload` and `supervisor` under this process's cgroup, in the unified
# hierarchy and (on a hybrid host) in systemd's named one; empty ones left by an earlier run
# make it fail, and they go again after the run.
nspawn_cgroups() {
    local v1 v2
    v2=$(sed -n 's/^0:://p' /proc/self/cgroup)
    v1=$(sed -n 's/^[0-9]*:name=systemd://p' /proc/self/cgroup)
    for dir in "/sys/fs/cgroup/unified${v2%/}" "/sys/fs/cgroup${v2%/}" "/sys/fs/cgroup/systemd${v1%/}"; do
        for sub in payload supervisor; do
            [ -n "$v2$v1" ] && [ -d "$dir/$sub" ] &&
                find "$dir/$sub" -depth -type d -exec rmdir {} + 2>/dev/null
        done
    done
    return 0
}
nspawn_cgroups
machine=agentry-check-$$
booted=0
# shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
unshare --mount --propagation private bash -c '
    mount -t overlay overlay -o "lowerdir=$1:/usr" "$2/usr"
    SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 exec timeout 180 systemd-nspawn --quiet --register=no \
        --keep-unit --private-network --machine="$3" -D "$2" --bind="$4:/out" \
        --bind-ro="$5:/usr/local/bin/agentry" -b systemd.unit=agentry-check.service' \
    bash "$tmp/usr-agentry" "$r" "$machine" "$tmp/out" "$(realpath "$bin")" \
    >"$tmp/boot.log" 2>&1 || booted=$?
# What nspawn leaves: its cgroups (empty once the container is gone) and its directory in
# /run.
nspawn_cgroups
rm -rf "/run/systemd/nspawn/propagate/$machine" "/run/systemd/nspawn/locks/"*"$machine"* 2>/dev/null || true
rmdir /run/systemd/nspawn/propagate /run/systemd/nspawn/locks /run/systemd/nspawn 2>/dev/null || true
show() { echo "-- $1"; sed 's/^/   /' "$tmp/out/$1" 2>/dev/null || echo "   (missing)"; }
if [ "$(cat "$tmp/out/readyz" 2>/dev/null)" != '{"status":"ready"}' ]; then
    tail -40 "$tmp/boot.log" >&2
    show agentry.log >&2
    fail "agentry.service did not answer /readyz under systemd (nspawn exit status $booted)"
fi
echo "agentry.service: /readyz answered $(cat "$tmp/out/readyz"), running as $(cat "$tmp/out/user")"
[ "$(cat "$tmp/out/user")" = agentry ] || fail "agentry.service does not run as agentry"
show data
grep -qx '/var/lib/agentry agentry 700' "$tmp/out/data" || fail "the data directory is not agentry's, 0700"
grep -qx '/var/lib/agentry/agentry.db agentry 600' "$tmp/out/data" || fail "no database written, or not 0600"
show stopped
if ! grep -qx 'Result=success' "$tmp/out/stopped" || ! grep -qx 'ExecMainStatus=0' "$tmp/out/stopped"; then
    fail "agentry.service did not stop cleanly on SIGTERM"
fi
grep -E '^(ok|warn|FAIL) +sandbox ' "$tmp/out/agentry-doctor.log" | sed 's/^/agentry doctor under the unit: /'
grep -qE '^ok +sandbox ' "$tmp/out/agentry-doctor.log" || {
    show agentry-doctor.log >&2
    fail "bubblewrap does not work under the unit"
}
grep -q 'agents run in a bubblewrap sandbox.*tmpfs_size=true.*disable_userns=true' \
    "$tmp/out/agentry-doctor.log" ||
    fail "bubblewrap works under the unit, but without all its features: $(grep -i warn "$tmp/out/agentry-doctor.log")"
echo "(with every feature: --disable-userns, a sized /tmp, a network namespace)"
sandbox_line() { grep -E '^(ok|warn|FAIL) +sandbox ' "$tmp/out/$1" | cut -c1-220; }
echo "with SystemCallFilter=~@mount added: $(sandbox_line agentry-doctor-mount.log)"
grep -qE '^FAIL +sandbox .*bwrap' "$tmp/out/agentry-doctor-mount.log" ||
    fail "bubblewrap also works with SystemCallFilter=~@mount: this check cannot fail"
echo "with ProtectKernelTunables=yes added: $(sandbox_line agentry-doctor-tunables.log), $(
    grep -o 'disable_userns=[a-z]*' "$tmp/out/agentry-doctor-tunables.log")"
grep -q 'agents run in a bubblewrap sandbox.*disable_userns=false' \
    "$tmp/out/agentry-doctor-tunables.log" ||
    fail "--disable-userns also works with ProtectKernelTunables=yes: this check cannot fail"

step "ok ($(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s)"
echo "figure: unit exposure $exposure (systemd-analyze security --offline=yes, at most $max_exposure)"
