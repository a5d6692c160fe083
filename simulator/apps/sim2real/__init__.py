"""How close to a real GPU: measured vLLM runs (`runs`), the cost model's fit to the training
runs (`fit`, `fairsim-fit`)."""
