# Sourced, not run: a private apt configuration for fetching Debian packages
# of a suite the system may not carry (hack/kernels.sh, hack/debroot.sh).
# apt gets its own sources list, state and cache under a directory of the
# caller's cache, so the system's apt setup is never touched, and the
# status file is empty, so nothing installed here counts as present.
#
#   apt_private DIR SUITE   sets apt_opts (an array) for that configuration
#   apt_private_update NAME runs apt-get update with it (NAME prefixes messages)
#
# KPR_DEBIAN_MIRROR overrides the mirror (default deb.debian.org).

apt_private() {
	local dir=$1 suite=$2
	local mirror=${KPR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
	mkdir -p "$dir/state/lists/partial" "$dir/cache/archives/partial" "$dir/etc" "$dir/debs"
	echo "deb $mirror $suite main" >"$dir/etc/sources.list"
	apt_opts=(-o "Dir::Etc::sourcelist=$dir/etc/sources.list" -o "Dir::Etc::sourceparts=-"
		-o "Dir::State=$dir/state" -o "Dir::Cache=$dir/cache" -o "Dir::State::status=/dev/null"
		-o "APT::Architecture=$(dpkg --print-architecture)" -o "Debug::NoLocking=1" -o "Acquire::Languages=none"
		-o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
}

apt_private_update() {
	echo "$1: apt update (private config)" >&2
	apt-get "${apt_opts[@]}" -qq update >&2
}
