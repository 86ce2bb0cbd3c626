#!/usr/bin/env bash
# Renders an attn report in headless Chromium and saves screenshots, to
# check the page as a reader sees it: the table of contents, every plot,
# the tables.
#
# Usage: scripts/report-screenshots.sh [DIR]
#
# DIR defaults to report-check/. A report there is drawn again (attn
# report) by this version; when DIR has none, a small one is made first (a few minutes on 2 cores): a Gaussian benchmark of every
# mechanism, prefill and decode, with its accuracy sweeps, a patching run
# and a needle run of the embedded model, all in DIR. The screenshots go
# to DIR/screenshots/: page.png (the whole page, 1400 pixels wide), and
# the figures one by one as the page shows them (fig-NAME.png).
#
# Needs chromium (Debian: apt-get install chromium) and the Go toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-report-check}
CHROME=${CHROME:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$CHROME" ]; then
	echo "no chromium on PATH (set CHROME=/path/to/chrome)" >&2
	exit 1
fi
ATTN=$(mktemp -d)/attn
go build -o "$ATTN" ./cmd/attn
if [ -f "$DIR/report.html" ]; then
	"$ATTN" report -out "$DIR" # drawn by this version
else
	"$ATTN" bench -input gaussian -n 256,512,1024,2048 -heads 4 -d 64 -reps 3 -row-time 1s \
		-budget 3m -accuracy-n 512 -out "$DIR"
	"$ATTN" bench -mode decode -n 1024,4096,16384 -heads 8 -reps 3 -budget 1m -out "$DIR/decode"
	"$ATTN" patching -ctx 256 -tokens 1024 -layers all -mech window,longformer,hyper -out "$DIR"
	"$ATTN" needle -n 256,512 -depths 0,0.5,1 -trials 2 -mech exact,window -out "$DIR"
fi
SHOTS="$DIR/screenshots"
mkdir -p "$SHOTS"
PAGE=$(realpath "$DIR/report.html")
# The whole page: tall enough for every section.
"$CHROME" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
	--window-size=1400,30000 --screenshot="$SHOTS/page.png" "file://$PAGE" 2>/dev/null
# Each figure alone, in the page's style: a page of its own holding the
# figure's element (a line of report.html, id fig-NAME), since a
# screenshot shows the top of a page.
HEAD=$(sed -n '1,/<\/head>/p' "$PAGE")
grep '<figure id="fig-' "$PAGE" | while IFS= read -r fig; do
	name=$(echo "$fig" | sed 's/.*id="fig-\([^"]*\)".*/\1/')
	one="$SHOTS/fig-$name.html"
	printf '%s\n<body>\n%s\n</body></html>\n' "$HEAD" "$fig" >"$one"
	"$CHROME" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
		--window-size=1100,620 --screenshot="$SHOTS/fig-$name.png" "file://$(realpath "$one")" 2>/dev/null
	rm "$one"
done
if [ -f "$DIR/decode/report.html" ]; then
	"$CHROME" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
		--window-size=1400,12000 --screenshot="$SHOTS/decode-page.png" "file://$(realpath "$DIR/decode/report.html")" 2>/dev/null
fi
ls -l "$SHOTS"
