#!/usr/bin/env bash
# Builds the VM test's Debian image from Debian's packages — debootstrap (minbase) with
# cloud-init and no Node — and prints the folder that holds it: disk.raw (ext4, booted
# read-only with snapshot=on), vmlinuz and initrd.img. The folder is a cache outside the
# repository, keyed by this recipe (a hash of this file), so an unchanged recipe is built
# once per machine. Needs root (debootstrap), mkfs.ext4 -d.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Comments aside, so rewording one does not rebuild the image.
recipe=$(grep -v "^ *#" "$here/image.sh" | sha256sum | cut -c1-16)
cache=${RUNNER_DEPOT_CACHE:-$HOME/.cache/runner-depot}/vm-image-$recipe
if [ -f "$cache/done" ]; then echo "$cache"; exit 0; fi
mirror=${RUNNER_DEPOT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${TMPDIR:-/tmp}/runner-depot-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
# The .deb files are kept across recipes: a changed recipe re-downloads only what changed.
debs=${RUNNER_DEPOT_CACHE:-$HOME/.cache/runner-depot}/debs
mkdir -p "$debs"
# systemd-networkd brings up the static address below; python3-cffi-backend is a
# dependency cloud-init needs on minbase but does not pull in. No curl, no wget: the agent
# is fetched with python3 (which cloud-init brings), the last of renderCloudInit's fallbacks.
packages=systemd-sysv,udev,cloud-init,python3-cffi-backend,iproute2,linux-image-cloud-amd64,initramfs-tools,zstd
debootstrap --variant=minbase --cache-dir="$debs" --include="$packages" bookworm "$root" "$mirror" >&2
# A smaller initrd: only the modules this VM's virtio disk needs (MODULES=dep would need sysfs).
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >&2
# The guest's one address, in QEMU's user network, baked in (test/vm/boot-options.ts measured it
# against DHCP, the seed's network-config and the kernel's ip=), and
# systemd-networkd-wait-online masked: nothing here needs a route beyond the link.
chroot "$root" systemctl enable systemd-networkd >&2
chroot "$root" systemctl mask systemd-networkd-wait-online.service >&2
printf '[Match]\nName=e*\n\n[Network]\nAddress=10.0.2.15/24\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
  >"$root/etc/systemd/network/20-runner-vm.network"
# cloud-init leaves the network alone (the unit above is the whole of it: no fallback DHCP
# config, no rendering from a seed), and skips the locale module, which fails on minbase (no
# locales package) after seconds of work under TCG.
printf 'datasource_list: [ NoCloud, None ]\nnetwork: { config: disabled }\nlocale: false\n' \
  >"$root/etc/cloud/cloud.cfg.d/90-runner-depot.cfg"
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
