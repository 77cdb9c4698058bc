"""The verifier: owns the accelerator, runs the target model and verifies drafts."""
