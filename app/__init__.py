"""The bedside command line and the Streamlit dashboard."""
