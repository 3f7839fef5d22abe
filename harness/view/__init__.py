"""`atomix view`: a local web app over a results directory (see `harness.view.app`)."""
