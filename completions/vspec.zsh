#compdef vspec

_vspec_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _VSPEC_COMPLETE=complete_zsh vspec)
}

compdef _vspec_completion vspec
