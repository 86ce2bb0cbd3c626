#!/usr/bin/env bash
# usage: qemu-tests.sh ARCH QEMU [TAGS]  — cross-compiles every package's tests, runs them under qemu-user, -short.
arch=$1 qemu=$2 tags=${3:-}
cd /work/main
out=/root/w/s17/qemu/$arch${tags:+-$tags}
mkdir -p $out
for pkg in $(go list ./... ./cmd/...); do
  dir=$(go list -f '{{.Dir}}' $pkg)
  name=$(echo ${pkg#github.com/attnkit/attn} | tr '/' '_'); name=${name:-root}
  bin=$out/$name.test
  if ! GOARCH=$arch go test -c ${tags:+-tags $tags} -o $bin $pkg > $out/$name.build 2>&1; then echo "BUILD FAIL $pkg"; continue; fi
  [ -f $bin ] || continue
  t0=$(date +%s)
  (cd $dir && timeout 1500 $qemu $bin -test.short > $out/$name.log 2>&1); rc=$?
  echo "$rc $(( $(date +%s)-t0 ))s $pkg"
done
