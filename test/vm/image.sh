#!/usr/bin/env bash
# Builds the VM test's Debian image from Debian's packages — debootstrap (minbase) with
# cloud-init and no Node — and prints the folder that holds it: disk.raw (ext4, booted
# read-only with snapshot=on), vmlinuz and initrd.img. The folder is a cache outside the
# repository, keyed by this recipe (a hash of this file), so an unchanged recipe is built
# once per machine. Needs root (debootstrap), mkfs.ext4 -d.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
recipe=$(sha256sum "$here/image.sh" | cut -c1-16)
cache=${RUNNER_DEPOT_CACHE:-$HOME/.cache/runner-depot}/vm-image-$recipe
if [ -f "$cache/done" ]; then echo "$cache"; exit 0; fi
mirror=${RUNNER_DEPOT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${TMPDIR:-/tmp}/runner-depot-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
# The .deb files are kept across recipes: a changed recipe re-downloads only what changed.
debs=${RUNNER_DEPOT_CACHE:-$HOME/.cache/runner-depot}/debs
mkdir -p "$debs"
# cloud-init's networkd renderer writes the seed's static network; python3-cffi-backend is a
# dependency cloud-init needs on minbase but does not pull in. No curl, no wget: the agent
# is fetched with python3 (which cloud-init brings), the last of renderCloudInit's fallbacks.
packages=systemd-sysv,udev,cloud-init,python3-cffi-backend,iproute2,linux-image-cloud-amd64,initramfs-tools,zstd
debootstrap --variant=minbase --cache-dir="$debs" --include="$packages" bookworm "$root" "$mirror" >&2
# A smaller initrd: only the modules this VM's virtio disk needs (MODULES=dep would need sysfs).
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >&2
# Static network from the seed needs networkd running; the seed's datasource is NoCloud only.
chroot "$root" systemctl enable systemd-networkd >&2
printf 'datasource_list: [ NoCloud, None ]\n' >"$root/etc/cloud/cloud.cfg.d/90-runner-depot.cfg"
echo 'runner-vm' >"$root/etc/hostname"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
mkdir -p "$work/out"
cp "$root"/boot/vmlinuz-* "$work/out/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/out/initrd.img"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
mkfs.ext4 -q -L root -d "$root" "$work/out/disk.raw" 2G >&2
mkdir -p "$(dirname "$cache")"
rm -rf "$cache"
mv "$work/out" "$cache"
touch "$cache/done"
echo "$cache"
