mod e2e {}
