#!/bin/bash
# qemu-sweep.sh COUNT ARCH QEMU PKG...: each package's tests COUNT times under qemu, fresh seeds.
count=$1 arch=$2 qemu=$3; shift 3
d=$(mktemp -d)
for pkg in "$@"; do
	bin="$d/$arch$(echo "$pkg" | tr -c 'a-z\n' _).test"
	GOARCH=$arch go test -c -o "$bin" "$pkg" || { echo "BUILD FAIL $pkg"; continue; }
	start=$(date +%s)
	if (cd "$pkg" && "$qemu" "$bin" -test.short -test.count "$count" > "$d/out.txt" 2>&1); then
		echo "PASS $arch $pkg $(( $(date +%s) - start ))s"
	else
		echo "FAIL $arch $pkg"; grep -v "^=== \|^PASS\|^ok" "$d/out.txt" | head -20
	fi
done
rm -rf "$d"
