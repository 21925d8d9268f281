#!/usr/bin/env bash
# tf-starts-hook.sh PYTHON: a .pth in PYTHON's site-packages that runs tests/tf_starts.py at start-up
# when PINPOINT_TF_STARTS is set (the test tiers set it: each TensorFlow start-up is charged to its
# test). Unset, the line costs one environment look-up.
set -euo pipefail
python=$1
hook="$(cd "$(dirname "$0")/.." && pwd)/tests/tf_starts.py"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import os; exec(compile(open(p).read(), p, 'exec'), {'__name__': 'pinpoint_tf_starts'}) if os.environ.get('PINPOINT_TF_STARTS') and os.path.exists(p := '$hook') else None" \
  > "$site/pinpoint_tf_starts.pth"
