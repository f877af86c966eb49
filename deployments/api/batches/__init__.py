"""OpenAI's Files and Batches APIs on the HTTP side: the batch request body and the routes (the batch manager
that runs them: deployments/batch/)."""
