"""OpenAI's Files and Batches APIs: the batch request body (the routes: deployments/http/routes/batches.py; the
batch manager that runs them: deployments/batch/)."""
