"""data_pipeline"""
