# call B: mini sweep at Cache 100, then 20 (finished runs are kept: a rerun resumes)
source .val/common.sh
V mini 100
V mini 20
