"""The Streamlit on-call dashboard: thin pages over one data layer (``data.py``) and plain figure
functions (``figures.py``). ``bedside serve`` starts it with the run's owner in the same process."""
