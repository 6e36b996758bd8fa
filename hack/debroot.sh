# Sourced, not run: a file tree from Debian packages, for the images that
# are built without a container daemon or a base image (hack/image-rootfs.sh
# for kpr's image, hack/cluster-images.sh for the test cluster's images).
#
#   debroot NAME DIR PACKAGE...
#
# fills DIR (which must not exist) with PACKAGE... and every package they
# depend on, as apt resolves them, extracted, without docs or man pages, with
# the merged-/usr links and the directories a container expects (tmp, run,
# proc, sys, dev). dpkg's maintainer scripts never run: what they would do
# (alternatives, users, generated files) is the caller's to do.
#
# The .debs are cached in ${KPR_IMAGE_CACHE:-~/.cache/kpr/image}/<suite>/debs
# for NAME kpr and .../debs-NAME otherwise, and downloaded again only when
# that package list changes or KPR_IMAGE_REFRESH=1 (for security updates).
# apt runs with a private configuration (hack/apt.sh). KPR_IMAGE_SUITE picks
# the Debian suite (default trixie, Debian 13). The caller sets -e.
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

debroot_suite=${KPR_IMAGE_SUITE:-trixie}
debroot_cache=${KPR_IMAGE_CACHE:-$HOME/.cache/kpr/image}/$debroot_suite

debroot() {
	local name=$1 out=$2
	shift 2
	local packages=("$@") debs=$debroot_cache/debs-$name who="debroot $name"
	if [[ $name == kpr ]]; then
		debs=$debroot_cache/debs
	fi
	if [[ -e $out ]]; then
		echo "$who: $out exists; remove it first" >&2
		return 1
	fi
	apt_private "$debroot_cache" "$debroot_suite"
	mkdir -p "$debs"
	(
		# The apt lists are shared by every NAME: one update or download
		# at a time (two builds may run at once, and apt's own locks are
		# off in the private configuration).
		flock 9
		if [[ ${KPR_IMAGE_REFRESH:-} == 1 || $(cat "$debs/packages.want" 2>/dev/null) != "${packages[*]}" ]]; then
			apt_private_update "$who: $debroot_suite"
			rm -f "$debs"/*.deb "$debs/packages.want"
			echo "$who: $debroot_suite: downloading ${packages[*]} and their dependencies" >&2
			# install --download-only resolves the dependency closure the
			# way an install would (alternatives, virtual packages),
			# against the empty status file: every package the closure
			# needs is fetched.
			apt-get "${apt_opts[@]}" -o "Dir::Cache::archives=$debs" -qq -y --no-install-recommends \
				install --download-only "${packages[@]}" >&2
			echo "${packages[*]}" >"$debs/packages.want"
		fi
	) 9>"$debroot_cache/.apt.lock"

	mkdir -p "$out"
	local n=0 deb d
	for deb in "$debs"/*.deb; do
		dpkg-deb -x "$deb" "$out"
		n=$((n + 1))
	done
	if [[ $n -eq 0 ]]; then
		echo "$who: no packages in $debs" >&2
		return 1
	fi
	# The merged-/usr links (the ELF interpreter is /lib64/ld-linux-x86-64.so.2,
	# /bin/sh is /usr/bin/sh).
	mkdir -p "$out/usr/bin" "$out/usr/sbin"
	for d in bin sbin lib lib64; do
		if [[ -d $out/usr/$d && ! -e $out/$d ]]; then
			ln -s "usr/$d" "$out/$d"
		fi
	done
	mkdir -p "$out/tmp" "$out/run" "$out/var" "$out/proc" "$out/sys" "$out/dev" "$out/usr/local/bin"
	chmod 1777 "$out/tmp"
	ln -sfn ../run "$out/var/run"
	# What nothing in an image reads.
	rm -rf "$out"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$out"/etc/{cron.*,logrotate.d}
	echo "$who: $n packages from $debroot_suite in $out" >&2
}

# debroot_alternative DIR LINK TARGET: the link update-alternatives would
# make (LINK a path in DIR, the tree's root; TARGET relative to LINK's
# directory), if TARGET is in the tree.
debroot_alternative() {
	local out=$1 link=$2 target=$3
	if [[ ! -e $out/$(dirname "$link")/$target ]]; then
		echo "debroot: $target is not in $out (for $link)" >&2
		return 1
	fi
	ln -sfn "$target" "$out/$link"
}

# debroot_busybox DIR: a link to busybox for every applet of DIR's
# /usr/bin/busybox that no package in DIR provides, so that a package's tool
# (netcat-openbsd's nc, iproute2's ip) is the one on PATH, as in an Alpine
# image with those packages. That needs Debian's busybox package:
# busybox-static's shell runs its own applets before PATH's programs.
debroot_busybox() {
	local out=$1 bb=$1/usr/bin/busybox applets applet cmd n=0
	if [[ ! -x $bb ]]; then
		echo "debroot: no busybox in $out" >&2
		return 1
	fi
	# The packages are of this machine's architecture, but a dynamic
	# busybox may want a newer libc than this machine's: then it runs with
	# the tree's own loader and libraries.
	if ! applets=$("$bb" --list-full 2>/dev/null); then
		local ld=("$out"/usr/lib/*-linux-gnu*/ld-linux*.so.?)
		applets=$("${ld[0]}" --library-path "$(dirname "${ld[0]}")" "$bb" --list-full)
	fi
	for applet in $applets; do
		cmd=${applet##*/}
		if [[ -e $out/usr/bin/$cmd || -L $out/usr/bin/$cmd || -e $out/usr/sbin/$cmd || -L $out/usr/sbin/$cmd ]]; then
			continue
		fi
		case $applet in
		sbin/* | usr/sbin/*) ln -s /usr/bin/busybox "$out/usr/sbin/$cmd" ;;
		*) ln -s /usr/bin/busybox "$out/usr/bin/$cmd" ;;
		esac
		n=$((n + 1))
	done
	echo "debroot: $n busybox applets in $out" >&2
}
