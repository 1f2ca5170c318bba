#!/bin/sh
# tools/elastic_launch.sh - relaunches an MPI job at one process fewer when it fails
# (a crashed rank ends an MPI job that has no ULFM), as torchrun's elastic agent does.
#
#   sh tools/elastic_launch.sh [-n NP] [-m MIN] [-r RESTARTS] [-l "MPIRUN WORDS"] [--] PROGRAM [ARGS...]
#
#   -n NP        processes of the first launch (default 2)
#   -m MIN       the fewest processes to relaunch at (default 1)
#   -r RESTARTS  the most relaunches (default 3)
#   -l WORDS     the launcher and its options (default: $DSGD_MPIRUN, else
#                "mpirun"; as root with OpenMPI: "mpirun --allow-run-as-root
#                --oversubscribe")
#
# Each launch runs WORDS -np N PROGRAM ARGS with DSGD_ELASTIC_RESTART (0 on
# the first launch, then 1, 2, ...) and DSGD_ELASTIC_NP (N) in the
# environment (OpenMPI's mpirun is given -x for each; MPICH's passes the
# environment on). A launch that ends with status 0 ends the script with 0;
# any other status relaunches at N - 1 while N - 1 >= MIN and restarts are
# left, else the script ends with that status. The program resumes: it
# restores its last checkpoint when there is one (dsgd_strategy_restore
# moves a checkpoint between group sizes) and saves one as it goes
# (dsgd_strategy_save, written atomically, so a crash leaves the last
# complete one). A deterministic failure is relaunched too, RESTARTS times
# at most: read the first launch's messages.
set -u

np=2
min=1
restarts=3
words=${DSGD_MPIRUN:-mpirun}
usage() {
    echo "usage: sh tools/elastic_launch.sh [-n NP] [-m MIN] [-r RESTARTS] [-l \"MPIRUN WORDS\"] [--] PROGRAM [ARGS...]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
    -n) [ $# -ge 2 ] || usage; np=$2; shift 2 ;;
    -m) [ $# -ge 2 ] || usage; min=$2; shift 2 ;;
    -r) [ $# -ge 2 ] || usage; restarts=$2; shift 2 ;;
    -l) [ $# -ge 2 ] || usage; words=$2; shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || usage
for v in "$np" "$min" "$restarts"; do
    case $v in '' | *[!0-9]*) usage ;; esac
done
if [ "$np" -lt 1 ] || [ "$min" -lt 1 ]; then usage; fi

# OpenMPI forwards only the variables it is told to (-x).
export_flags=
# shellcheck disable=SC2086
if $words --version 2>&1 | grep -q 'Open MPI'; then
    export_flags="-x DSGD_ELASTIC_RESTART -x DSGD_ELASTIC_NP"
fi

restart=0
while :; do
    DSGD_ELASTIC_RESTART=$restart
    DSGD_ELASTIC_NP=$np
    export DSGD_ELASTIC_RESTART DSGD_ELASTIC_NP
    echo "elastic_launch: launch $restart at np $np" >&2
    # shellcheck disable=SC2086
    $words $export_flags -np "$np" "$@"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "elastic_launch: the job ended at np $np after $restart relaunch(es)" >&2
        exit 0
    fi
    if [ "$restart" -ge "$restarts" ] || [ $((np - 1)) -lt "$min" ]; then
        echo "elastic_launch: the job failed at np $np (status $rc); no relaunch left (restarts $restart of $restarts, min $min)" >&2
        exit "$rc"
    fi
    restart=$((restart + 1))
    np=$((np - 1))
    echo "elastic_launch: the job failed (status $rc); relaunching at np $np from the last checkpoint" >&2
done
