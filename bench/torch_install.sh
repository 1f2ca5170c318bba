# bench/torch_install.sh - PyTorch in a virtual environment for the benches
# that compare distsgd with it (bench/peers.sh, bench/cnn.sh). Sourced, not
# run: the caller sets, from the repository root,
#   VENV        the virtual environment (kept and reused; build/peers-venv)
#   TORCH_REQ   the pip requirement for PyTorch
#   TORCH_INDEX a pip index for torch, tried first (PEERS_TORCH_INDEX; empty:
#               none, pip installs torch as it is configured)
#   PYTHON      the Python that makes the virtual environment
#   OUT         where install.log goes
#   STUBS       where the CUDA stand-ins go ($VENV/cuda-stubs)
# and calls torch_setup, which installs PyTorch when it does not already work
# (how: bench/peers.sh's header) and sets torch_ok (1: it runs) and
# torch_env (the environment torch runs need: PEERS_CUDA_STUBS when the
# stand-ins are in use); PEERS_SKIP_TORCH=1 skips it. Messages name the
# calling script.

torch_env=()   # the environment torch runs get (PEERS_CUDA_STUBS when needed)
torch_ok=0
torch_reason=""

# Runs the venv's Python on a smoke test; 0 when torch trains on the CPU.
torch_works() {
    env "${torch_env[@]}" "$VENV/bin/python" -B -c '
import sys; sys.path.insert(0, "bench"); import peers_torch  # loads the stubs, if any
import torch
x = torch.ones(4, 3, requires_grad=True); (x * 2).sum().backward()
assert float(x.grad.sum()) == 24.0 and not torch.cuda.is_available()
print("torch", torch.__version__, "works on the CPU")' >>"$OUT/install.log" 2>&1
}

set_torch_env() {
    torch_env=()
    if [ -d "$STUBS" ]; then torch_env=("PEERS_CUDA_STUBS=$STUBS"); fi
}

# The last line of the install log that says something, for the reason.
last_error() { grep -v '^\s*$' "$OUT/install.log" | grep -iE 'error|fail|not found|No matching' | tail -n 1 || true; }

install_torch() {
    local pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
    : >"$OUT/install.log"
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PYTHON" -m venv "$VENV" >>"$OUT/install.log" 2>&1; then
            rm -rf "$VENV"
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                echo "${0##*/}: $PYTHON -m venv failed; installing Debian's python3-venv"
                DEBIAN_FRONTEND=noninteractive apt-get update >>"$OUT/install.log" 2>&1 || true
                DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
                    </dev/null >>"$OUT/install.log" 2>&1 || true
            fi
            if ! "$PYTHON" -m venv "$VENV" >>"$OUT/install.log" 2>&1; then
                rm -rf "$VENV"
                torch_reason="'$PYTHON -m venv' failed (Debian: apt-get install python3-venv)"
                return 1
            fi
        fi
    fi
    set_torch_env
    if torch_works; then
        echo "PyTorch: reusing $VENV"
        return 0
    fi
    local t0=$SECONDS
    # 1. The index the user named (PEERS_TORCH_INDEX), when it answers: torch
    #    from there, its dependencies as pip is configured
    if [ -n "${TORCH_INDEX:-}" ]; then
        if "$VENV/bin/python" -c '
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/", timeout=5).close()' "$TORCH_INDEX" >/dev/null 2>&1; then
            echo "PyTorch: installing $TORCH_REQ from $TORCH_INDEX"
            if "${pip[@]}" install --no-deps --index-url "$TORCH_INDEX" "$TORCH_REQ" >>"$OUT/install.log" 2>&1 &&
                "${pip[@]}" install "$TORCH_REQ" numpy >>"$OUT/install.log" 2>&1; then
                rm -rf "$STUBS"
                set_torch_env
                if torch_works; then
                    echo "PyTorch: installed in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1) in $VENV"
                    return 0
                fi
            fi
            echo "PyTorch: torch from $TORCH_INDEX did not install or work ($(last_error)); installing as pip is" \
                "configured"
        else
            echo "PyTorch: $TORCH_INDEX does not answer; installing as pip is configured"
        fi
    fi
    # 2. torch as pip is configured (its default index, PIP_INDEX_URL,
    #    pip.conf), without its dependencies: where that is the CUDA build
    #    (PyPI's Linux x86-64 wheel), the multi-GB nvidia-* packages stay out
    #    and stand-ins take the place of the CUDA libraries it links
    echo "PyTorch: pip install --no-deps $TORCH_REQ (about 520 MB to download), then its pure-Python dependencies"
    if ! "${pip[@]}" install --no-deps "$TORCH_REQ" >>"$OUT/install.log" 2>&1; then
        torch_reason="pip install --no-deps $TORCH_REQ failed: $(last_error)"
        return 1
    fi
    if ! "${pip[@]}" install filelock 'typing-extensions>=4.13.0' 'sympy>=1.13.3' 'networkx>=2.5.1' jinja2 \
        'fsspec>=0.8.5' numpy >>"$OUT/install.log" 2>&1; then
        torch_reason="installing torch's pure-Python dependencies failed: $(last_error)"
        return 1
    fi
    rm -rf "$STUBS"
    if ! "$VENV/bin/python" -c 'import torch' >>"$OUT/install.log" 2>&1; then
        if ! "$VENV/bin/python" bench/peers_torch.py --make-cuda-stubs "$STUBS" >>"$OUT/install.log" 2>&1; then
            rm -rf "$STUBS"
            torch_reason="building stand-ins for torch's CUDA libraries failed: $(last_error)"
            return 1
        fi
        echo "PyTorch: $(tail -n 1 "$OUT/install.log")"
    fi
    set_torch_env
    if ! torch_works; then
        torch_reason="'import torch' fails: $(last_error)"
        return 1
    fi
    echo "PyTorch: installed in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1) in $VENV"
}

# Sets torch_ok=1 when PyTorch runs (installing it when absent), else says
# plainly why not (PEERS_SKIP_TORCH=1, or the install's failure) and leaves
# torch_ok=0: the caller then runs distsgd alone.
torch_setup() {
    if [ "${PEERS_SKIP_TORCH:-0}" = 1 ]; then
        echo "PyTorch skipped (PEERS_SKIP_TORCH=1); running distsgd alone"
    else
        echo "== PyTorch (log: $OUT/install.log)"
        if install_torch; then
            torch_ok=1
        else
            [ -n "$torch_reason" ] || torch_reason="see $OUT/install.log"
            echo "PyTorch could not be installed: $torch_reason; running distsgd alone"
        fi
    fi
}
