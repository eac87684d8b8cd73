#!/usr/bin/env bash
# A tiny Linux guest for the VM desktops' tests, bench and example task, built offline from Debian packages in
# a few seconds (cua_rl/local_gym/vm/guest_image.py runs this when the image is missing or this script
# changed). Output in OUT (default ~/.cache/cua-rl/vm-test-guest): vmlinuz, initrd.gz and base.qcow2 (ext4
# root: busybox, qemu-guest-agent and the libraries it links, an init that starts the agent and a shell on
# the framebuffer console tty1). examples/vm_tasks/901-vm-shell-files.yaml boots it (accel tcg: this
# machine's nested KVM starts QEMU but does not boot this kernel, a warning about CPUID pni; `-cpu host`
# fails on an MSR). Timings: docs/bench/vm_bench.json.
#
# Needs: apt-get (download only), dpkg-deb, mke2fs (e2fsprogs), qemu-img, gzip; busybox's own cpio.
set -euo pipefail
OUT="${1:-${CUA_RL_HOME:-$HOME/.cache/cua-rl}/vm-test-guest}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"   # apt-get download runs as _apt, which must write here
cd "$WORK"
KPKG="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
KV="${KPKG#linux-image-}"
apt-get download -qq busybox-static qemu-guest-agent "$KPKG" >/dev/null
dpkg-deb -x "$(ls "$KPKG"_*.deb)" k
dpkg-deb -x "$(ls busybox-static_*.deb)" bb
dpkg-deb -x "$(ls qemu-guest-agent_*.deb)" qga
BB="$WORK/bb/bin/busybox"
M="k/lib/modules/$KV/kernel"
mkdir -p initrd/{bin,dev,proc,sys,newroot,lib/modules} \
         rootfs/{bin,sbin,dev,proc,sys,tmp,root,etc,usr/bin,lib64,lib/x86_64-linux-gnu,run}
cp "$BB" initrd/bin/busybox
# virtio disk and console, ext4 (and crc32c, which it loads through the crypto API), bochs: the DRM driver
# of QEMU's std VGA, whose framebuffer the kernel's console then draws on (1280x800), and the USB tablet the
# gym points with (uhci, usbhid, hid-generic; evdev gives it a /dev/input/event node). Each module's
# dependencies (its .modinfo "depends=") come first; the list is the order init loads them in.
declare -A SEEN=()
MODS=""
add_module() {
  local m="$1" f d
  [ -n "${SEEN[$m]:-}" ] && return
  SEEN[$m]=1
  f="$(find "$M" \( -name "$m.ko" -o -name "${m//_/-}.ko" \) | head -1)"
  [ -n "$f" ] || { echo "kernel module $m not found in $KPKG" >&2; exit 1; }
  for d in $(grep -a -o 'depends=[^[:cntrl:]]*' "$f" | head -1 | cut -d= -f2 | tr , ' '); do add_module "$d"; done
  cp "$f" "initrd/lib/modules/$m.ko"
  MODS="$MODS $m"
}
for m in virtio_pci virtio_blk virtio_console crc32c_generic ext4 bochs uhci_hcd usbhid hid_generic evdev; do
  add_module "$m"
done
cat > initrd/init <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(echo $MODS); do insmod /lib/modules/\$m.ko || echo "insmod \$m failed"; done
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.1; done
mount -t ext4 -o rw /dev/vda /newroot || { echo "no root disk"; exec sh; }
mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
exec switch_root /newroot /sbin/init
INIT
chmod +x initrd/init
(cd initrd && find . | "$BB" cpio -o -H newc 2>/dev/null | gzip -1) > initrd.gz
cp "$BB" rootfs/bin/busybox
ln -s /bin/busybox rootfs/sbin/hwclock   # qemu-ga's guest-set-time runs /sbin/hwclock (unsupported without it)
cp qga/usr/sbin/qemu-ga rootfs/usr/bin/qemu-ga
for lib in $(ldd qga/usr/sbin/qemu-ga | awk '/=>/{print $3} /ld-linux/{print $1}'); do
  mkdir -p "rootfs$(dirname "$lib")"
  cp -L "$lib" "rootfs$(dirname "$lib")/"
done
cat > rootfs/sbin/init <<'INIT'
#!/bin/busybox sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin   # the kernel starts init without one
/bin/busybox --install -s /bin
mkdir -p /dev/pts; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
hostname guest
cat /proc/sys/kernel/random/boot_id > /dev/null   # drawn on first read: now, so resumed copies share it
port=""
for d in /sys/class/virtio-ports/*; do [ "$(cat "$d/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] && port=/dev/${d##*/}; done
echo 0 > /sys/class/graphics/fbcon/cursor_blink 2>/dev/null   # a still screen between actions
clear > /dev/tty1
# the agent's log (every request it reads and answer it sends: --verbose) goes to the serial port, which the host
# keeps in the machine's serial.log: a guest whose agent goes silent shows there whether a request reached it
if [ -n "$port" ]; then
  /usr/bin/qemu-ga --verbose --method=virtio-serial --path="$port" --statedir=/run >/dev/ttyS0 2>&1 &
  ready="cua-rl test guest ready (guest agent on $port)"
else
  ready="cua-rl test guest ready (no guest agent port)"
fi
echo "$ready" > /dev/tty1; echo "$ready" > /dev/ttyS0
while true; do setsid sh -c 'exec sh -i </dev/tty1 >/dev/tty1 2>&1'; done
INIT
chmod +x rootfs/sbin/init
echo "root:x:0:0:root:/root:/bin/sh" > rootfs/etc/passwd
mke2fs -q -t ext4 -O ^metadata_csum,^64bit -L guest -d rootfs root.img 64M
mkdir -p "$OUT"
qemu-img convert -f raw -O qcow2 root.img "$OUT/base.qcow2"
cp initrd.gz "$OUT/initrd.gz"
cp "k/boot/vmlinuz-$KV" "$OUT/vmlinuz"
echo "$OUT"
