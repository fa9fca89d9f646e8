# tree_commit: the short commit of this tree, with "-dirty" when tracked files differ from it (a
# copied tree whose git metadata lags its files matches no commit), or "unknown" outside git.
# Sourced by the GPU scripts; experiments.bench.timing.commit_id runs it too.
tree_commit() {
  local sha
  sha=$(git rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo "$sha-dirty"; else echo "$sha"; fi
}
